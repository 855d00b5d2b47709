package fencegate

import (
	"context"
	"errors"
	"math/rand"
	"sync"
	"time"
)

// LeaseOptions of Client.Lease.
type LeaseOptions struct {
	// TTL of the lease (default 10s). It is renewed every TTL/3.
	TTL time.Duration
	// Owner shown to others (GET /v1/locks/{name}); default "host:pid".
	Owner string
	// Wait: how long to keep retrying while the lock is held (0: *LockHeldError at once;
	// negative: until ctx ends).
	Wait time.Duration
	// RenewEvery overrides TTL/3.
	RenewEvery time.Duration
}

// Lease is a held built-in lock, renewed in the background every TTL/3 until it is released
// or lost. Its writes (Put, Delete, Batch, Claim, TablePut, ...) carry its token and scope.
//
// Lost means: a renew was refused (409 lock-lost, 403); no renew succeeded before the lease's
// expiry (measured on this process's monotonic clock from just before the grant or the last
// renew was sent, less a margin of max(TTL/10, 100ms), at most TTL/3: a process frozen past its
// lease knows it when it wakes); or a write under it was refused as stale (412), or as a token
// its lock no longer vouches for (422 token-not-issued under its scope). Then Lost() is closed,
// Err() says why, and every write under the lease returns *LeaseLostError without sending.
type Lease struct {
	c          *Client
	name       string
	ttl, every time.Duration
	margin     time.Duration

	mu       sync.Mutex
	grant    *Grant
	deadline time.Time // monotonic
	lostErr  *LeaseLostError
	released bool
	lost     chan struct{}
	stop     chan struct{}
	done     chan struct{}
}

// Lease takes the built-in lock name and keeps it renewed until Release.
func (c *Client) Lease(ctx context.Context, name string, o LeaseOptions) (*Lease, error) {
	if o.TTL <= 0 {
		o.TTL = 10 * time.Second
	}
	if o.Owner == "" {
		o.Owner = defaultOwner()
	}
	every := o.RenewEvery
	if every <= 0 {
		every = o.TTL / 3
	}
	var until time.Time
	if o.Wait > 0 {
		until = time.Now().Add(o.Wait)
	}
	for {
		sent := time.Now()
		g, err := c.Acquire(ctx, name, o.TTL, o.Owner)
		if err == nil {
			margin := o.TTL / 10
			if margin < 100*time.Millisecond {
				margin = 100 * time.Millisecond
			}
			if margin > o.TTL/3 {
				margin = o.TTL / 3
			}
			l := &Lease{c: c, name: name, ttl: o.TTL, every: every, margin: margin, grant: g,
				deadline: sent.Add(o.TTL - margin), lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
			go l.renewLoop()
			return l, nil
		}
		var held *LockHeldError
		var unavailable *UnavailableError
		var transport *TransportError
		retry := errors.As(err, &held) || errors.As(err, &unavailable) || errors.As(err, &transport)
		if !retry || o.Wait == 0 || ctx.Err() != nil || (o.Wait > 0 && !time.Now().Before(until)) {
			return nil, err
		}
		pause := 250 * time.Millisecond
		if held != nil {
			pause = time.Duration(held.RemainingMs) * time.Millisecond
			if pause < 20*time.Millisecond {
				pause = 20 * time.Millisecond
			}
			if pause > time.Second {
				pause = time.Second
			}
		}
		pause = time.Duration(float64(pause) * (0.8 + 0.4*rand.Float64()))
		if o.Wait > 0 {
			if left := time.Until(until); pause > left {
				pause = left
			}
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// Name of the lock.
func (l *Lease) Name() string { return l.name }

// Token of this lease: a decimal string.
func (l *Lease) Token() string { l.mu.Lock(); defer l.mu.Unlock(); return l.grant.Token }

// Scope its writes are sent under: the lock's name.
func (l *Lease) Scope() string { l.mu.Lock(); defer l.mu.Unlock(); return l.grant.Scope }

// Grant is the server's last grant or renew answer.
func (l *Lease) Grant() Grant { l.mu.Lock(); defer l.mu.Unlock(); return *l.grant }

// Lost is closed when the lease is lost (not when it is released).
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err is nil while the lease is held; then the *LeaseLostError saying why it was lost (or
// that it was released).
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errLocked()
}

func (l *Lease) errLocked() error {
	if l.lostErr == nil && !l.released && !time.Now().Before(l.deadline) {
		l.loseLocked(nil, "its expiry passed without a successful renew")
	}
	if l.lostErr != nil {
		return l.lostErr
	}
	if l.released {
		return &LeaseLostError{Name: l.name, Token: l.grant.Token, Reason: "it was released"}
	}
	return nil
}

// Remaining is the time left before this side counts the lease as expired (0 when not held).
func (l *Lease) Remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.errLocked() != nil {
		return 0
	}
	return time.Until(l.deadline)
}

func (l *Lease) loseLocked(cause error, why string) {
	if l.lostErr != nil || l.released {
		return
	}
	l.lostErr = &LeaseLostError{Name: l.name, Token: l.grant.Token, Reason: why, Cause: cause}
	close(l.lost)
}

func (l *Lease) lose(cause error, why string) {
	l.mu.Lock()
	l.loseLocked(cause, why)
	l.mu.Unlock()
}

func (l *Lease) renewLoop() {
	defer close(l.done)
	next := time.Now().Add(l.every)
	for {
		l.mu.Lock()
		deadline := l.deadline
		l.mu.Unlock()
		wake := next
		if deadline.Before(wake) {
			wake = deadline
		}
		t := time.NewTimer(time.Until(wake))
		select {
		case <-l.stop:
			t.Stop()
			return
		case <-l.lost:
			t.Stop()
			return
		case <-t.C:
		}
		if l.Err() != nil { // the expiry passed: lost
			return
		}
		if time.Now().Before(next) {
			continue
		}
		sent := time.Now()
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		go func() { // a Release stops a renew in flight
			select {
			case <-l.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		g, err := l.c.Renew(ctx, l.name, l.Token(), l.ttl)
		cancel()
		select {
		case <-l.stop:
			return
		default:
		}
		if err == nil {
			l.mu.Lock()
			l.grant = g
			if l.lostErr == nil {
				l.deadline = sent.Add(l.ttl - l.margin)
			}
			l.mu.Unlock()
			next = sent.Add(l.every)
			continue
		}
		var lockLost *LockLostError
		var forbidden *ForbiddenError
		if errors.As(err, &lockLost) || errors.As(err, &forbidden) {
			l.lose(err, "a renew was refused")
			return
		}
		// No answer, 503, a timeout: try again soon, until the deadline says lost.
		retry := l.ttl / 10
		if retry < 10*time.Millisecond {
			retry = 10 * time.Millisecond
		}
		next = time.Now().Add(retry)
	}
}

// Release stops renewing and releases the lock. Releasing a lost lease is not an error (the
// lock is released if the server still counts it as ours); a second Release does nothing.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	wasLost := l.errLocked() != nil
	l.released = true
	token := l.grant.Token
	close(l.stop)
	l.mu.Unlock()
	<-l.done
	err := l.c.ReleaseLock(ctx, l.name, token)
	var lockLost *LockLostError
	if err != nil && (wasLost || errors.As(err, &lockLost)) {
		return nil
	}
	return err
}

// Check returns the *LeaseLostError if the lease is no longer held: call it between the steps
// of long work.
func (l *Lease) Check() error { return l.Err() }

func (l *Lease) opts(extra []Option) []Option {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(append([]Option{}, extra...), Token(l.grant.Token), Scope(l.grant.Scope))
}

func (l *Lease) after(err error) error {
	if err == nil {
		return nil
	}
	var stale *StaleTokenError
	var notIssued *TokenNotIssuedError
	if errors.As(err, &stale) {
		l.lose(err, "a write under it was refused as stale")
	} else if errors.As(err, &notIssued) && notIssued.Scope == l.Scope() {
		l.lose(err, "a write under it was refused: its lock no longer vouches for the token")
	}
	return err
}

// Put writes key under the lease's token and scope. Extra options: Proof, Header.
func (l *Lease) Put(ctx context.Context, key string, value any, opts ...Option) (*WriteResult, error) {
	if err := l.Err(); err != nil {
		return nil, err
	}
	r, err := l.c.Put(ctx, key, value, l.opts(opts)...)
	return r, l.after(err)
}

// Get reads a key (no token needed; works on a lost lease too).
func (l *Lease) Get(ctx context.Context, key string) (*Entry, error) { return l.c.Get(ctx, key) }

// Delete deletes key under the lease.
func (l *Lease) Delete(ctx context.Context, key string, opts ...Option) (*DeleteResult, error) {
	if err := l.Err(); err != nil {
		return nil, err
	}
	r, err := l.c.Delete(ctx, key, l.opts(opts)...)
	return r, l.after(err)
}

// Batch applies ops all or nothing under the lease.
func (l *Lease) Batch(ctx context.Context, ops []Op, opts ...Option) (*BatchResult, error) {
	if err := l.Err(); err != nil {
		return nil, err
	}
	r, err := l.c.Batch(ctx, ops, l.opts(opts)...)
	return r, l.after(err)
}

// Claim the lease's scope (the grant already did; harmless to repeat).
func (l *Lease) Claim(ctx context.Context, opts ...Option) (*Fence, error) {
	if err := l.Err(); err != nil {
		return nil, err
	}
	r, err := l.c.Claim(ctx, l.Scope(), l.opts(opts)...)
	return r, l.after(err)
}

// TablePut replaces a table row under the lease.
func (l *Lease) TablePut(ctx context.Context, resource string, key RowKey, row map[string]any, opts ...Option) (*WriteResult, error) {
	if err := l.Err(); err != nil {
		return nil, err
	}
	r, err := l.c.TablePut(ctx, resource, key, row, l.opts(opts)...)
	return r, l.after(err)
}

// TablePatch updates a table row under the lease.
func (l *Lease) TablePatch(ctx context.Context, resource string, key RowKey, row map[string]any, opts ...Option) (*WriteResult, error) {
	if err := l.Err(); err != nil {
		return nil, err
	}
	r, err := l.c.TablePatch(ctx, resource, key, row, l.opts(opts)...)
	return r, l.after(err)
}

// TableDelete deletes a table row under the lease.
func (l *Lease) TableDelete(ctx context.Context, resource string, key RowKey, opts ...Option) (*DeleteResult, error) {
	if err := l.Err(); err != nil {
		return nil, err
	}
	r, err := l.c.TableDelete(ctx, resource, key, l.opts(opts)...)
	return r, l.after(err)
}
