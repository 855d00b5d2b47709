package fencegate_test

// Idempotency-Key: every write carries one, its retry carries the same, and a write that landed
// is answered with its first outcome even after a newer holder fenced the writer out. The lost
// answers are real: the request reaches the fencegate under test and its answer is dropped.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	fencegate "github.com/fencegate/fencegate/clients/go"
)

// recorder sends every request, keeps its Idempotency-Key and, while lose is set, drops the
// first keyed answer after the server applied the write (running between first).
type recorder struct {
	mu      sync.Mutex
	keys    []string
	lose    bool
	between func()
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	key := req.Header.Get("Idempotency-Key")
	r.mu.Lock()
	r.keys = append(r.keys, key)
	lose := r.lose && key != ""
	if lose {
		r.lose = false
	}
	r.mu.Unlock()
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || !lose {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if r.between != nil {
		r.between()
	}
	return nil, errors.New("the answer was lost (test)")
}

func recordingClient(t *testing.T, rec *recorder, retries int) *fencegate.Client {
	c, err := fencegate.NewWithOptions(serverURL(t), fencegate.Options{
		HTTPClient: &http.Client{Transport: rec, Timeout: 60 * time.Second},
		Retries:    retries,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTheSameKeyAfterANewerHolderGetsTheFirstAnswerReplayed(t *testing.T) {
	c, ctx, k := client(t), ctx(t), name(t)
	scope, ik := k+"-s", fencegate.NewIdempotencyKey()
	first := must[*fencegate.WriteResult](t)(c.Put(ctx, k, map[string]any{"n": 1}, fencegate.Token("5"), fencegate.Scope(scope), fencegate.IdempotencyKey(ik)))
	if !first.Created || first.Replayed {
		t.Fatalf("first: %+v", first)
	}
	must[*fencegate.Fence](t)(c.Claim(ctx, scope, fencegate.Token("6"))) // a newer holder
	again := must[*fencegate.WriteResult](t)(c.Put(ctx, k, map[string]any{"n": 1}, fencegate.Token("5"), fencegate.Scope(scope), fencegate.IdempotencyKey(ik)))
	if !again.Replayed || !again.Created || again.FenceToken != first.FenceToken || again.Version != first.Version {
		t.Fatalf("retry with the key: %+v, first %+v", again, first)
	}
	// without the key the write is judged again: fenced out
	as[*fencegate.StaleTokenError](t, err2(c.Put(ctx, k, map[string]any{"n": 1}, fencegate.Token("5"), fencegate.Scope(scope))))
	// the same key with another write: 422, nothing changed
	as[*fencegate.IdempotencyKeyReusedError](t, err2(c.Put(ctx, k, map[string]any{"n": 2}, fencegate.Token("7"), fencegate.Scope(scope), fencegate.IdempotencyKey(ik))))
	if got := must[*fencegate.Entry](t)(c.Get(ctx, k)); string(got.Value) != `{"n":1}` {
		t.Fatalf("value after the refusals: %s", got.Value)
	}
}

func TestEveryWriteSendsItsOwnKey(t *testing.T) {
	rec := &recorder{}
	c, ctx, k := recordingClient(t, rec, 0), ctx(t), name(t)
	must[*fencegate.WriteResult](t)(c.Put(ctx, k, 1, fencegate.Token("1")))
	must[*fencegate.WriteResult](t)(c.Put(ctx, k, 2, fencegate.Token("1")))
	must[*fencegate.DeleteResult](t)(c.Delete(ctx, k, fencegate.Token("2")))
	must[*fencegate.BatchResult](t)(c.Batch(ctx, []fencegate.Op{fencegate.PutOp(k, 3)}, fencegate.Token("3")))
	must[*fencegate.Fence](t)(c.Claim(ctx, k+"-s", fencegate.Token("4")))
	must[*fencegate.Entry](t)(c.Get(ctx, k))
	must[*fencegate.Grant](t)(c.Acquire(ctx, k+"-lock", time.Second, "idem-test"))
	hex := regexp.MustCompile(`^[0-9a-f]{32}$`)
	seen := map[string]bool{}
	for _, key := range rec.keys[:5] {
		if !hex.MatchString(key) {
			t.Fatalf("a write's key is not 32 hex digits: %q (all: %q)", key, rec.keys)
		}
		if seen[key] {
			t.Fatalf("two writes without an explicit key sent the same key: %q", rec.keys)
		}
		seen[key] = true
	}
	if rec.keys[5] != "" || rec.keys[6] != "" {
		t.Fatalf("a read or a lock acquire sent a key: %q", rec.keys)
	}
}

func TestALostAnswerIsRetriedWithTheSameKeyAndReplayed(t *testing.T) {
	other, ctx, k := client(t), ctx(t), name(t)
	scope := k + "-s"
	rec := &recorder{lose: true, between: func() {
		if _, err := other.Claim(context.Background(), scope, fencegate.Token("9")); err != nil {
			t.Errorf("the newer holder's claim: %v", err)
		}
	}}
	c := recordingClient(t, rec, 0)
	b := must[*fencegate.BatchResult](t)(c.Batch(ctx, []fencegate.Op{fencegate.PutOp(k, "landed")}, fencegate.Token("8"), fencegate.Scope(scope)))
	if !b.Replayed || b.FenceToken != "8" {
		t.Fatalf("the retried batch: %+v", b)
	}
	if len(rec.keys) != 2 || rec.keys[0] != rec.keys[1] {
		t.Fatalf("the retry did not send the same key: %q", rec.keys)
	}
	if got := must[*fencegate.Entry](t)(other.Get(ctx, k)); string(got.Value) != `"landed"` {
		t.Fatalf("value: %s", got.Value)
	}
}

func TestWithoutRetriesALostAnswerIsATransportError(t *testing.T) {
	rec := &recorder{lose: true}
	c, ctx, k := recordingClient(t, rec, -1), ctx(t), name(t)
	as[*fencegate.TransportError](t, err2(c.Put(ctx, k, 1, fencegate.Token("1"))))
	if len(rec.keys) != 1 {
		t.Fatalf("sent %d times, want once", len(rec.keys))
	}
}

func TestABadKeyIsRefusedBeforeSending(t *testing.T) {
	c, ctx, k := client(t), ctx(t), name(t)
	for _, bad := range []string{"a b", "é", string(make([]byte, 256))} {
		if _, err := c.Put(ctx, k, 1, fencegate.Token("1"), fencegate.IdempotencyKey(bad)); err == nil {
			t.Fatalf("key %q was accepted", bad)
		}
	}
}
