// Package fencegate is a client of fencegate, the HTTP service that fences writes at the
// resource: every write carries the fencing token of the lock its writer holds, and fencegate
// refuses a token older than one it has already accepted.
//
//	c := fencegate.New("http://127.0.0.1:8080")
//	l, err := c.Lease(ctx, "nightly", fencegate.LeaseOptions{TTL: 10 * time.Second, Owner: "worker-1"})
//	if err != nil { ... }
//	defer l.Release(context.Background())
//	res, err := l.Put(ctx, "invoice-7", map[string]any{"total": 120}) // token and scope sent for you
//	<-l.Lost()                                                       // closed when the lease is lost
//
// With a lock of your own (etcd, ZooKeeper, Redis, ...), send its token yourself:
//
//	c.Put(ctx, "invoice-7", v, fencegate.Token(tok), fencegate.Scope("billing"))
//
// Every refusal is an error type of its own, matched with errors.As: *StaleTokenError
// {Presented, Current string}, *ScopeMismatchError, *TokenNotIssuedError, *LockHeldError, ...
// Tokens are strings of decimals everywhere, never floats. Standard library only.
package fencegate
