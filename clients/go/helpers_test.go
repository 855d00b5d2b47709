package fencegate_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	fencegate "github.com/fencegate/fencegate/clients/go"
)

// The fencegate under test (FENCEGATE_URL), its binary for servers of our own with other
// configurations (FENCEGATE_BIN), and the PostgreSQL database those use (DATABASE_URL).
// Nothing here skips: a missing setting or tool fails the test and says what is missing.

var run = func() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}()

func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run clients/go/test.sh (FENCEGATE_URL, FENCEGATE_BIN, DATABASE_URL)", name)
	}
	return v
}

func serverURL(t *testing.T) string { return strings.TrimRight(env(t, "FENCEGATE_URL"), "/") }

func client(t *testing.T) *fencegate.Client {
	c, err := fencegate.NewWithOptions(serverURL(t), fencegate.Options{Timeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// name is unique to this run and test: keys, scopes and locks live for ever in fencegate.
func name(t *testing.T) string {
	return "go-" + run + "-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// must fails the test on an error.
func must[T any](t *testing.T) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return v
	}
}

// as asserts err is (wraps) an E and returns it.
func as[E error](t *testing.T, err error) E {
	t.Helper()
	var e E
	if !errors.As(err, &e) {
		t.Fatalf("want %T, got %T: %v", e, err, err)
	}
	return e
}

// eventually polls cond until it holds or the (generous) deadline passes.
func eventually(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ---- servers of our own -----------------------------------------------------------------------

type server struct {
	URL  string
	Dir  string
	cmd  *exec.Cmd
	logs *os.File
}

// startServer runs `fencegate serve` on a free port with this config, on DATABASE_URL (or on
// SQLite in its temp dir when sqlite is true), and stops it when the test ends.
func startServer(t *testing.T, config string, sqlite bool, extraEnv ...string) *server {
	t.Helper()
	bin := env(t, "FENCEGATE_BIN")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "fencegate.toml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logs, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--config", cfg)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "FENCEGATE_CONFIG=") || strings.HasPrefix(kv, "FENCEGATE_LISTEN=") ||
			(sqlite && strings.HasPrefix(kv, "DATABASE_URL=")) {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	if !sqlite {
		env(t, "DATABASE_URL")
	}
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Stderr = logs
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start %s: %v", bin, err)
	}
	s := &server{Dir: dir, cmd: cmd, logs: logs}
	t.Cleanup(s.stop)
	line := make(chan string, 1)
	go func() {
		r := bufio.NewReader(out)
		l, _ := r.ReadString('\n')
		line <- l
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case l := <-line:
		if !strings.HasPrefix(l, "listening on ") {
			t.Fatalf("fencegate did not start: %q\n%s", l, s.log())
		}
		addr := strings.TrimSpace(strings.TrimPrefix(l, "listening on "))
		if strings.Contains(addr, "://") {
			s.URL = addr
		} else {
			s.URL = "http://" + addr
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("fencegate did not start within 60s:\n%s", s.log())
	}
	return s
}

func (s *server) log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "stderr.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (s *server) stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = s.cmd.Process.Kill()
			<-done
		}
	}
	s.logs.Close()
}

func psql(t *testing.T, sql string) {
	t.Helper()
	db := env(t, "DATABASE_URL")
	if !strings.HasPrefix(db, "postgres") {
		t.Fatalf("DATABASE_URL must be a PostgreSQL URL, got %q", db)
	}
	if _, err := exec.LookPath("psql"); err != nil {
		t.Fatal("these tests need psql (Debian: apt-get install postgresql-client)")
	}
	out, err := exec.Command("psql", db, "-v", "ON_ERROR_STOP=1", "-qc", sql).CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
}

// ---- Redis: a server of our own, and a tiny RESP client ---------------------------------------

type redisConn struct {
	mu sync.Mutex
	c  net.Conn
	r  *bufio.Reader
}

// startRedis runs redis-server on a free port in a temp dir (no persistence) for this test.
func startRedis(t *testing.T) *redisConn {
	t.Helper()
	exe, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("this test needs redis-server (Debian: apt-get install redis-server)")
	}
	dir := t.TempDir()
	port := freePort(t)
	cmd := exec.Command(exe, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var conn net.Conn
	eventually(t, "redis-server accepts connections", 30*time.Second, func() bool {
		conn, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		return err == nil
	})
	rc := &redisConn{c: conn, r: bufio.NewReader(conn)}
	t.Cleanup(func() { conn.Close() })
	eventually(t, "redis-server answers PING", 30*time.Second, func() bool {
		v, err := rc.do("PING")
		return err == nil && v == "PONG"
	})
	return rc
}

func (r *redisConn) do(args ...string) (any, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(r.c, b.String()); err != nil {
		return nil, err
	}
	return r.read()
}

func (r *redisConn) read() (any, error) {
	line, err := r.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty RESP line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, errors.New(line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r.r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		out := make([]any, 0, n)
		for i := 0; i < n; i++ {
			v, err := r.read()
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected RESP %q", line)
}
