package fencegate_test

import (
	"errors"
	"testing"

	fencegate "github.com/fencegate/fencegate/clients/go"
)

func TestWritesReadsDeletesWithTokensAsStrings(t *testing.T) {
	c, ctx, k := client(t), ctx(t), name(t)
	big := "9007199254740993" // 2^53 + 1: a float64 would send ...992
	w := must[*fencegate.WriteResult](t)(c.Put(ctx, k, map[string]any{"total": 120}, fencegate.Token(big)))
	if !w.Created || w.FenceToken != big || w.Key != k || w.Scope != "" {
		t.Fatalf("first put: %+v", w)
	}
	w = must[*fencegate.WriteResult](t)(c.Put(ctx, k, map[string]any{"total": 121}, fencegate.Token(big)))
	if w.Created {
		t.Fatalf("second put under the same token: %+v", w)
	}
	e := must[*fencegate.Entry](t)(c.Get(ctx, k))
	var v struct{ Total int }
	if err := e.Decode(&v); err != nil || v.Total != 121 || e.FenceToken != big {
		t.Fatalf("get: %+v %v %v", e, v, err)
	}
	d := must[*fencegate.DeleteResult](t)(c.Delete(ctx, k, fencegate.Token(fencegate.MaxToken)))
	if !d.Deleted || d.FenceToken != fencegate.MaxToken {
		t.Fatalf("delete: %+v", d)
	}
	as[*fencegate.NotFoundError](t, err2(c.Get(ctx, k)))
	// the tombstone keeps the fence
	st := as[*fencegate.StaleTokenError](t, err2(c.Put(ctx, k, 1, fencegate.Token(big))))
	if st.Presented != big || st.Current != fencegate.MaxToken || st.Key != k || st.Status != 412 {
		t.Fatalf("stale after delete: %+v", st)
	}
	// keys with slashes, spaces and non-ASCII are one path segment
	odd := k + "/a b/café %"
	must[*fencegate.WriteResult](t)(c.Put(ctx, odd, "x", fencegate.Token("1")))
	if got := must[*fencegate.Entry](t)(c.Get(ctx, odd)); got.Key != odd || string(got.Value) != `"x"` {
		t.Fatalf("odd key: %+v", got)
	}
}

func err2[T any](_ T, err error) error { return err }

func TestStaleWriteIsTypedWithBothTokens(t *testing.T) {
	c, ctx, k := client(t), ctx(t), name(t)
	scope := k + "-lock"
	must[*fencegate.WriteResult](t)(c.Put(ctx, k, "new", fencegate.Token("34"), fencegate.Scope(scope)))
	err := err2(c.Put(ctx, k, "zombie", fencegate.Token("33"), fencegate.Scope(scope)))
	var stale *fencegate.StaleTokenError
	if !errors.As(err, &stale) {
		t.Fatalf("want *StaleTokenError, got %T %v", err, err)
	}
	if stale.Presented != "33" || stale.Current != "34" || stale.Scope != scope || stale.Status != 412 ||
		stale.Slug != "stale-token" || stale.Type != fencegate.ProblemBase+"stale-token" {
		t.Fatalf("stale: %+v", stale)
	}
	if !fencegate.IsFencing(err) {
		t.Fatal("a stale token is a fencing refusal")
	}
	if p, ok := fencegate.AsProblem(err); !ok || p.Status != 412 || p.RequestID() == "" {
		t.Fatalf("AsProblem: %+v %v", p, ok)
	}
	if e := must[*fencegate.Entry](t)(c.Get(ctx, k)); string(e.Value) != `"new"` {
		t.Fatalf("the newer value was overwritten: %s", e.Value)
	}
}

func TestBatchClaimAndFences(t *testing.T) {
	c, ctx, k := client(t), ctx(t), name(t)
	scope := k + "-scope"
	r := must[*fencegate.BatchResult](t)(c.Batch(ctx, []fencegate.Op{
		fencegate.PutOp(k+"/a", 1), fencegate.PutOp(k+"/b", map[string]any{"n": 2}), fencegate.DeleteOp(k + "/c"),
	}, fencegate.Token("5"), fencegate.Scope(scope)))
	if r.FenceToken != "5" || r.Scope != scope || len(r.Results) != 3 || r.Results[0].Status != 201 || r.Results[2].Op != "delete" {
		t.Fatalf("batch: %+v", r)
	}
	f := must[*fencegate.Fence](t)(c.Claim(ctx, scope, fencegate.Token("9")))
	if f.FenceToken != "9" || f.Scope != scope || f.Created {
		t.Fatalf("claim: %+v", f)
	}
	if f := must[*fencegate.Fence](t)(c.Fence(ctx, scope)); f.FenceToken != "9" {
		t.Fatalf("fence: %+v", f)
	}
	as[*fencegate.NotFoundError](t, err2(c.Fence(ctx, scope+"-never")))
	// all or nothing: a stale batch applies nothing and names its scope
	st := as[*fencegate.StaleTokenError](t, err2(c.Batch(ctx, []fencegate.Op{fencegate.PutOp(k+"/a", "zombie")},
		fencegate.Token("8"), fencegate.Scope(scope))))
	if st.Presented != "8" || st.Current != "9" || st.Scope != scope {
		t.Fatalf("stale batch: %+v", st)
	}
	if e := must[*fencegate.Entry](t)(c.Get(ctx, k+"/a")); string(e.Value) != "1" {
		t.Fatalf("a refused batch wrote: %s", e.Value)
	}
	// unscoped batch: stale_keys lists every stale key with its fence
	must[*fencegate.WriteResult](t)(c.Put(ctx, k+"/x", 1, fencegate.Token("7")))
	must[*fencegate.WriteResult](t)(c.Put(ctx, k+"/y", 1, fencegate.Token("8")))
	st = as[*fencegate.StaleTokenError](t, err2(c.Batch(ctx, []fencegate.Op{
		fencegate.PutOp(k+"/x", 2), fencegate.PutOp(k+"/y", 2)}, fencegate.Token("6"))))
	if len(st.StaleKeys) != 2 || st.StaleKeys[0].Current == "" || st.Presented != "6" {
		t.Fatalf("stale keys: %+v", st)
	}
}

func TestTokensAreCheckedBeforeSending(t *testing.T) {
	c, ctx, k := client(t), ctx(t), name(t)
	for _, bad := range []string{"-1", "007", "1e3", "0x10", " 1", "9223372036854775808", "1.0"} {
		err := err2(c.Put(ctx, k, 1, fencegate.Token(bad)))
		if !errors.Is(err, fencegate.ErrInvalidToken) {
			t.Fatalf("token %q: want ErrInvalidToken, got %v", bad, err)
		}
	}
	// sent anyway (Do sends headers as given): the server's own refusal, typed
	_, err := c.Do(ctx, "PUT", "/v1/kv/"+fencegate.Segment(k), 1, fencegate.Token("007"))
	as[*fencegate.MalformedTokenError](t, err)
	// no token at all: 428
	as[*fencegate.MissingTokenError](t, err2(c.Put(ctx, k, 1)))
}

func TestAdapters(t *testing.T) {
	cases := []struct {
		got  func() (string, error)
		want string
	}{
		{func() (string, error) { return fencegate.EtcdRevision(1234567) }, "1234567"},
		{func() (string, error) { return fencegate.ZooKeeperSequence("/locks/job/_c_2f6a-lock-0000000042") }, "42"},
		{func() (string, error) { return fencegate.ZooKeeperSequence("lock-9223372036854775807") }, fencegate.MaxToken},
		{func() (string, error) { return fencegate.ZooKeeperZxid(0x100000002) }, "4294967298"},
		{func() (string, error) { return fencegate.RedisIncr(7) }, "7"},
		{func() (string, error) { return fencegate.TokenOf(9007199254740993) }, "9007199254740993"},
	}
	for i, c := range cases {
		if got, err := c.got(); err != nil || got != c.want {
			t.Errorf("case %d: %q %v, want %q", i, got, err, c.want)
		}
	}
	for _, bad := range []func() (string, error){
		func() (string, error) { return fencegate.EtcdRevision(0) },
		func() (string, error) { return fencegate.ZooKeeperSequence("/locks/job/lock-") },
		func() (string, error) { return fencegate.ZooKeeperSequence("/locks/job/lock-42") },
		func() (string, error) { return fencegate.RedisIncr(-1) },
		func() (string, error) { return fencegate.TokenOf(-5) },
	} {
		if _, err := bad(); !errors.Is(err, fencegate.ErrInvalidToken) {
			t.Errorf("want ErrInvalidToken, got %v", err)
		}
	}
}
