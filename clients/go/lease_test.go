package fencegate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	fencegate "github.com/fencegate/fencegate/clients/go"
)

func TestLeaseRenewsPastItsTTLAndWritesUnderItsScope(t *testing.T) {
	c, ctx, n := client(t), ctx(t), name(t)
	l := must[*fencegate.Lease](t)(c.Lease(ctx, n, fencegate.LeaseOptions{TTL: 900 * time.Millisecond, Owner: "renewer"}))
	defer l.Release(context.Background())
	if l.Scope() != n || fencegate.CheckToken(l.Token()) != nil {
		t.Fatalf("lease: %q %q", l.Scope(), l.Token())
	}
	// held for three times its TTL: only the renewals keep it
	until := time.Now().Add(2700 * time.Millisecond)
	for time.Now().Before(until) {
		h := must[*fencegate.Holder](t)(c.Holder(ctx, n))
		if h == nil || h.Owner != "renewer" {
			t.Fatalf("holder: %+v (lease: %v)", h, l.Err())
		}
		select {
		case <-l.Lost():
			t.Fatalf("lost: %v", l.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	w := must[*fencegate.WriteResult](t)(l.Put(ctx, n+"/k", map[string]any{"still": "valid"}))
	if w.FenceToken != l.Token() || w.Scope != n {
		t.Fatalf("write: %+v", w)
	}
	b := must[*fencegate.BatchResult](t)(l.Batch(ctx, []fencegate.Op{fencegate.PutOp(n+"/b", 1), fencegate.DeleteOp(n + "/k")}))
	if b.Scope != n {
		t.Fatalf("batch: %+v", b)
	}
	if f := must[*fencegate.Fence](t)(l.Claim(ctx)); f.FenceToken != l.Token() {
		t.Fatalf("claim: %+v", f)
	}
	if d := must[*fencegate.DeleteResult](t)(l.Delete(ctx, n+"/b")); !d.Deleted {
		t.Fatalf("delete: %+v", d)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if h := must[*fencegate.Holder](t)(c.Holder(ctx, n)); h != nil {
		t.Fatalf("still held after release: %+v", h)
	}
	as[*fencegate.LeaseLostError](t, err2(l.Put(ctx, n+"/k", "after release")))
	if err := l.Release(ctx); err != nil {
		t.Fatalf("a second release: %v", err)
	}
}

func TestLeaseWaitsWhileHeld(t *testing.T) {
	c, ctx, n := client(t), ctx(t), name(t)
	first := must[*fencegate.Lease](t)(c.Lease(ctx, n, fencegate.LeaseOptions{TTL: 10 * time.Second, Owner: "first"}))
	held := as[*fencegate.LockHeldError](t, err2(c.Lease(ctx, n, fencegate.LeaseOptions{TTL: 10 * time.Second})))
	if held.Holder != "first" {
		t.Fatalf("held: %+v", held)
	}
	go func() { time.Sleep(300 * time.Millisecond); _ = first.Release(context.Background()) }()
	second := must[*fencegate.Lease](t)(c.Lease(ctx, n, fencegate.LeaseOptions{TTL: 10 * time.Second, Owner: "second", Wait: 60 * time.Second}))
	defer second.Release(context.Background())
	if mustInt(t, second.Token()) <= mustInt(t, first.Token()) {
		t.Fatalf("tokens: %s then %s", first.Token(), second.Token())
	}
	// a context that ends stops the wait
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	as[*fencegate.LockHeldError](t, err2(c.Lease(short, n, fencegate.LeaseOptions{TTL: time.Second, Wait: -1})))
}

func TestLeaseIsLostWhenARenewIsRefused(t *testing.T) {
	c, ctx, n := client(t), ctx(t), name(t)
	l := must[*fencegate.Lease](t)(c.Lease(ctx, n, fencegate.LeaseOptions{TTL: 3 * time.Second}))
	defer l.Release(context.Background())
	must[*fencegate.AdminResult](t)(c.RetireLock(ctx, n, "the Go client's test ends this lease"))
	select {
	case <-l.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("the renewer did not notice the lease was gone")
	}
	ll := as[*fencegate.LeaseLostError](t, l.Err())
	as[*fencegate.LockLostError](t, ll.Cause)
	e := as[*fencegate.LeaseLostError](t, err2(l.Put(ctx, n+"/k", 1))) // not sent
	if !errors.Is(e, ll.Cause) || !fencegate.IsFencing(e) {
		t.Fatalf("lease lost: %v", e)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("releasing a lost lease: %v", err)
	}
}

func TestLeaseIsLostWhenAWriteIsRefusedStale(t *testing.T) {
	c, ctx, n := client(t), ctx(t), name(t)
	// renews rarely, so the lease has not noticed yet when the new holder writes
	old := must[*fencegate.Lease](t)(c.Lease(ctx, n, fencegate.LeaseOptions{TTL: 30 * time.Second, RenewEvery: time.Hour}))
	defer old.Release(context.Background())
	must[*fencegate.WriteResult](t)(old.Put(ctx, n+"/k", "old holder"))
	must[*fencegate.AdminResult](t)(c.RetireLock(ctx, n, "test: hand the lock over"))
	nw := must[*fencegate.Lease](t)(c.Lease(ctx, n, fencegate.LeaseOptions{TTL: 30 * time.Second}))
	defer nw.Release(context.Background())
	must[*fencegate.WriteResult](t)(nw.Put(ctx, n+"/other", "new holder"))
	if old.Err() != nil {
		t.Fatalf("lost too early: %v", old.Err())
	}
	st := as[*fencegate.StaleTokenError](t, err2(old.Put(ctx, n+"/k", "zombie")))
	if st.Presented != old.Token() || st.Current != nw.Token() {
		t.Fatalf("stale: %+v", st)
	}
	select {
	case <-old.Lost():
	default:
		t.Fatal("a 412 under the lease must lose it")
	}
	as[*fencegate.LeaseLostError](t, err2(old.Put(ctx, n+"/k", "again")))
	if e := must[*fencegate.Entry](t)(c.Get(ctx, n+"/k")); string(e.Value) != `"old holder"` {
		t.Fatalf("value: %s", e.Value)
	}
}

func TestLeaseIsLostWhenItsExpiryPassesWithoutARenew(t *testing.T) {
	c, ctx, n := client(t), ctx(t), name(t)
	l := must[*fencegate.Lease](t)(c.Lease(ctx, n, fencegate.LeaseOptions{TTL: 400 * time.Millisecond, RenewEvery: time.Hour}))
	defer l.Release(context.Background())
	select {
	case <-l.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("not lost after its expiry")
	}
	as[*fencegate.LeaseLostError](t, err2(l.Put(ctx, n+"/k", 1)))
}

// ---- a real zombie: a process using the library, frozen with SIGSTOP past its lease ------------

// TestMain lets this test binary be the zombie worker: run again with FENCEGATE_GO_ZOMBIE=1.
func TestMain(m *testing.M) {
	if os.Getenv("FENCEGATE_GO_ZOMBIE") == "1" {
		zombieWorker(os.Args[len(os.Args)-4:])
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func say(v any) { b, _ := json.Marshal(v); fmt.Println(string(b)) }

func describe(err error) map[string]any {
	out := map[string]any{"error": nil}
	if err == nil {
		return out
	}
	var stale *fencegate.StaleTokenError
	var lost *fencegate.LeaseLostError
	switch {
	case errors.As(err, &stale):
		out["error"], out["presented"], out["current"], out["scope"] = "StaleToken", stale.Presented, stale.Current, stale.Scope
	case errors.As(err, &lost):
		out["error"] = "LeaseLost"
	default:
		out["error"] = fmt.Sprintf("%T: %v", err, err)
	}
	return out
}

// zombieWorker: the ten-line worker, plus reports. Args: URL LOCK KEY TTL_MS.
func zombieWorker(args []string) {
	url, lock, key := args[0], args[1], args[2]
	var ttlMs int
	fmt.Sscan(args[3], &ttlMs)
	ctx := context.Background()
	c := fencegate.New(url)
	l, err := c.Lease(ctx, lock, fencegate.LeaseOptions{TTL: time.Duration(ttlMs) * time.Millisecond, Owner: "zombie"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// hold it past its TTL, writing as we go: the renewer keeps it
	until, n := time.Now().Add(time.Duration(ttlMs)*time.Millisecond*3/2), 0
	for time.Now().Before(until) {
		n++
		if _, err := l.Put(ctx, key, map[string]any{"by": "zombie", "n": n}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		time.Sleep(time.Duration(ttlMs) * time.Millisecond / 10)
	}
	say(map[string]any{"ready": true, "token": l.Token(), "writes": n, "held": l.Err() == nil})
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // frozen here by the test, then resumed
	_, late := l.Put(ctx, key, map[string]any{"by": "zombie", "late": true})
	// whatever the lease knew, the server refuses the old token on its own
	_, raw := c.Put(ctx, key, map[string]any{"by": "zombie", "late": "raw"}, fencegate.Token(l.Token()), fencegate.Scope(l.Scope()))
	lost := false
	select {
	case <-l.Lost():
		lost = true
	default:
	}
	say(map[string]any{"late": describe(late), "raw": describe(raw), "lost": lost})
	if err := l.Release(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
	say(map[string]any{"exited": true})
}

func TestARealZombieFrozenPastItsLeaseIsFenced(t *testing.T) {
	c, ctx, n := client(t), ctx(t), name(t)
	lock, key := n, n+"/invoice"
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--", serverURL(t), lock, key, "2000")
	cmd.Env = append(os.Environ(), "FENCEGATE_GO_ZOMBIE=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	defer func() { // whatever happened: never leave it frozen or running
		_ = cmd.Process.Signal(syscall.SIGCONT)
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	lines := make(chan map[string]any, 4)
	go func() {
		r := bufio.NewReader(stdout)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				close(lines)
				_, _ = io.Copy(io.Discard, r)
				return
			}
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil {
				lines <- m
			}
		}
	}()
	next := func(what string) map[string]any {
		select {
		case m, ok := <-lines:
			if ok {
				return m
			}
		case <-time.After(60 * time.Second):
		}
		t.Fatalf("the zombie sent no %s (stderr: %s)", what, stderr.String())
		return nil
	}
	ready := next("ready line")
	if ready["ready"] != true || ready["held"] != true {
		t.Fatalf("ready: %v", ready)
	}
	oldToken := ready["token"].(string)

	// a GC pause, a VM stall: frozen until its lease is over on the server
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the frozen zombie's lease expires", 60*time.Second, func() bool {
		h, err := c.Holder(ctx, lock)
		return err == nil && h == nil
	})
	nw := must[*fencegate.Lease](t)(c.Lease(ctx, lock, fencegate.LeaseOptions{TTL: 30 * time.Second, Owner: "new-holder", Wait: 30 * time.Second}))
	defer nw.Release(context.Background())
	if mustInt(t, nw.Token()) <= mustInt(t, oldToken) {
		t.Fatalf("tokens: %s then %s", oldToken, nw.Token())
	}
	must[*fencegate.WriteResult](t)(nw.Put(ctx, key, map[string]any{"by": "new holder"}))

	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin, "go")
	report := next("report")
	late := report["late"].(map[string]any)
	// refused by the server (StaleToken) or, the lease having noticed its lapse first, before
	// sending (LeaseLost)
	switch late["error"] {
	case "StaleToken":
		if late["presented"] != oldToken || late["current"] != nw.Token() {
			t.Fatalf("late write: %v", late)
		}
	case "LeaseLost":
	default:
		t.Fatalf("the zombie's late write under its lease: %v", late)
	}
	raw := report["raw"].(map[string]any)
	if raw["error"] != "StaleToken" || raw["presented"] != oldToken || raw["current"] != nw.Token() || raw["scope"] != lock {
		t.Fatalf("the zombie's raw write with its old token: %v", raw)
	}
	if report["lost"] != true {
		t.Fatalf("the zombie's lease does not know it is lost: %v", report)
	}
	if m := next("exit line"); m["exited"] != true {
		t.Fatalf("exit: %v", m)
	}
	select {
	case <-exited:
		if exitErr != nil {
			t.Fatalf("the zombie exited with %v: %s", exitErr, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the zombie did not exit")
	}
	e := must[*fencegate.Entry](t)(c.Get(ctx, key))
	if string(e.Value) != `{"by":"new holder"}` || e.FenceToken != nw.Token() {
		t.Fatalf("the new holder's value: %s (token %s)", e.Value, e.FenceToken)
	}
	if nw.Err() != nil {
		t.Fatalf("the new holder's lease: %v", nw.Err())
	}
}

// Bring your own lock: a Redis lock (SET NX PX) whose token comes from INCR in the same script,
// the scope claimed after each acquisition. The first holder's lock expires while it "pauses";
// a second holder takes it; the first one's late writes are refused, typed, with both tokens.
func TestABringYourOwnLockZombieIsFenced(t *testing.T) {
	c, ctx, n := client(t), ctx(t), name(t)
	r := startRedis(t)
	acquire := func(owner string, ttlMs int) (string, bool) {
		v, err := r.do("EVAL", fencegate.RedisFencedLockScript, "2", "lock:"+n, "lock:"+n+":fence", owner, fmt.Sprint(ttlMs))
		if err != nil {
			t.Fatal(err)
		}
		if v.(int64) == 0 {
			return "", false
		}
		tok := must[string](t)(fencegate.RedisIncr(v.(int64)))
		must[*fencegate.Fence](t)(c.Claim(ctx, n, fencegate.Token(tok))) // older holders fenced now
		return tok, true
	}
	a, ok := acquire("worker-a", 300)
	if !ok {
		t.Fatal("worker-a did not get the free lock")
	}
	must[*fencegate.WriteResult](t)(c.Put(ctx, n+"/invoice", "a", fencegate.Token(a), fencegate.Scope(n)))
	if _, ok := acquire("worker-b", 30000); ok {
		t.Fatal("worker-b got a held lock")
	}
	// worker-a pauses past its lock's expiry
	eventually(t, "worker-a's Redis lock expires", 60*time.Second, func() bool {
		v, err := r.do("EXISTS", "lock:"+n)
		return err == nil && v.(int64) == 0
	})
	b, ok := acquire("worker-b", 30000)
	if !ok {
		t.Fatal("worker-b did not get the expired lock")
	}
	must[*fencegate.WriteResult](t)(c.Put(ctx, n+"/invoice", "b", fencegate.Token(b), fencegate.Scope(n)))
	// worker-a wakes up and writes: the key worker-b wrote, and one worker-b never touched
	for _, key := range []string{n + "/invoice", n + "/untouched"} {
		st := as[*fencegate.StaleTokenError](t, err2(c.Put(ctx, key, "a, late", fencegate.Token(a), fencegate.Scope(n))))
		if st.Presented != a || st.Current != b || st.Scope != n {
			t.Fatalf("%s: %+v", key, st)
		}
	}
	if e := must[*fencegate.Entry](t)(c.Get(ctx, n+"/invoice")); string(e.Value) != `"b"` {
		t.Fatalf("worker-b's value: %s", e.Value)
	}
	as[*fencegate.NotFoundError](t, err2(c.Get(ctx, n+"/untouched")))
}
