mod socket;
pub mod tls;

pub use socket::{
    connect_tcp, connect_uds, set_tcp_user_timeout, BufferedSocket, Socket, SocketIntoBox,
    WithSocket, WriteBuffer,
};
