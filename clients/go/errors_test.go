package fencegate_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	fencegate "github.com/fencegate/fencegate/clients/go"
)

// problemTypes are the type URIs in the running server's /openapi.json: every string in the
// document that starts with the problem base (the Problem schema's `type` enum lists them all).
func problemTypes(t *testing.T) []string {
	resp, err := http.Get(serverURL(t) + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc any
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		case string:
			if strings.HasPrefix(v, fencegate.ProblemBase) {
				seen[v] = true
			}
		}
	}
	walk(doc)
	out := make([]string, 0, len(seen))
	for u := range seen {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// Every problem type the server defines maps to an error type of its own, named after it
// (stale-token: *StaleTokenError), that keeps the status, type and detail. A type the server
// adds and this library does not map fails here.
func TestEveryProblemTypeOfTheServerHasItsErrorType(t *testing.T) {
	types := problemTypes(t)
	if len(types) < 30 {
		t.Fatalf("only %d problem types in /openapi.json: %v", len(types), types)
	}
	for _, uri := range types {
		slug := strings.TrimPrefix(uri, fencegate.ProblemBase)
		body := fmt.Sprintf(`{"type":%q,"title":"t","status":409,"detail":"d","presented_token":"1","current_token":"2"}`, uri)
		err := fencegate.ParseProblem(409, http.Header{}, []byte(body))
		var unknown *fencegate.UnknownProblemError
		if errors.As(err, &unknown) {
			t.Errorf("%s: not mapped to an error type of its own", uri)
			continue
		}
		want := strings.ReplaceAll(strings.Title(strings.ReplaceAll(slug, "-", " ")), " ", "") + "Error" //nolint:staticcheck
		got := reflect.TypeOf(err).Elem().Name()
		if !strings.EqualFold(got, want) {
			t.Errorf("%s: mapped to %s, want %s", uri, got, want)
		}
		p, ok := fencegate.AsProblem(err)
		if !ok || p.Type != uri || p.Slug != slug || p.Detail != "d" || p.Status != 409 {
			t.Errorf("%s: problem %+v", uri, p)
		}
	}
	if n := len(fencegate.ProblemSlugs()); n != len(types) {
		t.Errorf("the library maps %d problem types, the server defines %d", n, len(types))
	}
	// and one it does not know is kept, whole, as *UnknownProblemError
	err := fencegate.ParseProblem(418, nil, []byte(`{"type":"https://fencegate.dev/problems/brand-new","x":"1"}`))
	if u := as[*fencegate.UnknownProblemError](t, err); u.Status != 418 || u.Body["x"] != "1" {
		t.Fatalf("unknown: %+v", u)
	}
}

// ---- raised by the fencegate under test, on their real statuses --------------------------------

func TestRefusalsOfTheServerUnderTest(t *testing.T) {
	c, ctx, k := client(t), ctx(t), name(t)
	as[*fencegate.InvalidKeyError](t, err2(c.Put(ctx, k+"\x01", 1, fencegate.Token("1"))))
	as[*fencegate.InvalidKeyError](t, err2(c.Put(ctx, strings.Repeat("x", 600), 1, fencegate.Token("1"))))
	as[*fencegate.InvalidScopeError](t, err2(c.Put(ctx, k, 1, fencegate.Token("1"), fencegate.Scope("bad\x02scope"))))
	as[*fencegate.InvalidJSONError](t, err2(c.Put(ctx, k, "nul \u0000 inside", fencegate.Token("1"))))
	as[*fencegate.InvalidBatchError](t, err2(c.Batch(ctx, []fencegate.Op{{"op": "frobnicate", "key": k}}, fencegate.Token("1"))))
	as[*fencegate.InvalidRequestError](t, err2(c.Acquire(ctx, k, 0, "x")))
	nf := as[*fencegate.NotFoundError](t, err2(c.Do(ctx, "GET", "/v1/nothing-here", nil)))
	if nf.Status != 404 {
		t.Fatalf("not found: %+v", nf)
	}
	as[*fencegate.MethodNotAllowedError](t, err2(c.Do(ctx, "PATCH", "/v1/kv/"+k, 1, fencegate.Token("1"))))
	as[*fencegate.PayloadTooLargeError](t, err2(c.Put(ctx, k, strings.Repeat("x", 2<<20), fencegate.Token("1"))))
	as[*fencegate.UnsupportedMediaTypeError](t, err2(c.Do(ctx, "PUT", "/v1/kv/"+k, 1, fencegate.Token("1"),
		fencegate.Header("Content-Type", "text/plain"))))
	as[*fencegate.MisdirectedRequestError](t, err2(c.Do(ctx, "GET", "/v1/kv/"+k, nil, fencegate.Header("Host", "rebound.example"))))

	// sticky scope
	must[*fencegate.WriteResult](t)(c.Put(ctx, k, 1, fencegate.Token("5"), fencegate.Scope(k+"-a")))
	sm := as[*fencegate.ScopeMismatchError](t, err2(c.Put(ctx, k, 1, fencegate.Token("5"), fencegate.Scope(k+"-b"))))
	if sm.Status != 409 || sm.Key != k || sm.Scope != k+"-a" || sm.PresentedScope != k+"-b" || !fencegate.IsFencing(sm) {
		t.Fatalf("scope mismatch: %+v", sm)
	}

	// the built-in lock
	g := must[*fencegate.Grant](t)(c.Acquire(ctx, k, 5*time.Second, "holder-1"))
	held := as[*fencegate.LockHeldError](t, err2(c.Acquire(ctx, k, 5*time.Second, "holder-2")))
	if held.Holder != "holder-1" || held.RemainingMs <= 0 {
		t.Fatalf("held: %+v", held)
	}
	wrong := "1"
	if g.Token == "1" {
		wrong = "2"
	}
	lost := as[*fencegate.LockLostError](t, err2(c.Renew(ctx, k, wrong, 5*time.Second)))
	if lost.Holder != "holder-1" {
		t.Fatalf("lock lost: %+v", lost)
	}
	next := must[string](t)(fencegate.TokenOf(mustInt(t, g.Token) + 1))
	ni := as[*fencegate.TokenNotIssuedError](t, err2(c.Put(ctx, k+"/k", 1, fencegate.Token(next), fencegate.Scope(k))))
	if ni.Presented != next || ni.LatestIssued != g.Token || ni.Scope != k || ni.Status != 422 {
		t.Fatalf("not issued: %+v", ni)
	}
	if err := c.ReleaseLock(ctx, k, g.Token); err != nil {
		t.Fatal(err)
	}
	must[*fencegate.Fence](t)(c.Claim(ctx, k+"-max", fencegate.Token(fencegate.MaxToken)))
	as[*fencegate.LockExhaustedError](t, err2(c.Acquire(ctx, k+"-max", time.Second, "")))

	must[*fencegate.Fence](t)(c.Claim(ctx, k+"-reset", fencegate.Token("10")))
	as[*fencegate.ResetNotBelowError](t, err2(c.ResetFence(ctx, k+"-reset", "10", "not below")))
}

func mustInt(t *testing.T, s string) int64 {
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestNoAnswerIsATransportError(t *testing.T) {
	c := must[*fencegate.Client](t)(fencegate.NewWithOptions(fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		fencegate.Options{Timeout: 10 * time.Second}))
	err := err2(c.Get(context.Background(), "x"))
	if te := as[*fencegate.TransportError](t, err); te.Method != "GET" {
		t.Fatalf("transport: %+v", te)
	}
	if _, ok := fencegate.AsProblem(err); ok {
		t.Fatal("no answer is not a problem")
	}
	bad := fencegate.New("not a url")
	if err := err2(bad.Get(context.Background(), "x")); err == nil {
		t.Fatal("a bad URL must fail every call")
	}
}

// ---- on a server of our own: auth, issuers, reserved names, the jump cap, a binding, a table ----

const (
	adminKey   = "fgk_admin_go_client_test_0123456789"
	limitedKey = "fgk_limited_go_client_test_0123456789"
	hmacSecret = "a-secret-of-at-least-thirty-two-bytes-for-the-go-tests"
)

var edPub, edPriv, _ = ed25519.GenerateKey(rand.Reader)

func table() string { return "goclient_orders_" + run }

func strict(t *testing.T) (*fencegate.Client, string) {
	t.Helper()
	psql(t, "CREATE TABLE IF NOT EXISTS public."+table()+" (tenant text NOT NULL, order_no integer NOT NULL, "+
		"amount integer NOT NULL DEFAULT 0 CHECK (amount >= 0), note text, PRIMARY KEY (tenant, order_no))")
	t.Cleanup(func() { psql(t, "DROP TABLE IF EXISTS public."+table()) })
	sha := func(k string) string { s := sha256.Sum256([]byte(k)); return hex.EncodeToString(s[:]) }
	config := fmt.Sprintf(`
[kv]
max_token_jump = 1000

[locks]
names = ["reserved/"]

[[scopes]]
name = "bound"
keys = ["bound/"]

[[issuers]]
name = "hm"
scopes = ["hm/"]
hmac_sha256_secret_env = "GOTEST_FG_HMAC"

[[issuers]]
name = "ed"
scopes = ["ed/"]
ed25519_public_key = "%s"

[[resources]]
name = "orders"
table = "public.%s"
key = ["tenant", "order_no"]
fence = "ledger"

[[auth.keys]]
name = "admin"
sha256 = "%s"
rights = ["admin"]
prefixes = [""]
tables = ["orders"]

[[auth.keys]]
name = "limited"
sha256 = "%s"
rights = ["read", "write"]
prefixes = ["mine/"]
`, base64.StdEncoding.EncodeToString(edPub), table(), sha(adminKey), sha(limitedKey))
	s := startServer(t, config, false, "GOTEST_FG_HMAC="+hmacSecret)
	c := must[*fencegate.Client](t)(fencegate.NewWithOptions(s.URL, fencegate.Options{APIKey: adminKey}))
	return c, s.URL
}

func TestRefusalsThatNeedAConfiguration(t *testing.T) {
	c, url := strict(t)
	ctx := ctx(t)
	k := "k-" + run

	t.Run("unauthenticated and forbidden", func(t *testing.T) {
		anon := fencegate.New(url)
		wrong := must[*fencegate.Client](t)(fencegate.NewWithOptions(url, fencegate.Options{APIKey: "fgk_nope"}))
		for _, x := range []*fencegate.Client{anon, wrong} {
			e := as[*fencegate.UnauthenticatedError](t, err2(x.Get(ctx, "mine/"+k)))
			if e.Status != 401 || !strings.HasPrefix(strings.ToLower(e.Header.Get("WWW-Authenticate")), "bearer") {
				t.Fatalf("401: %+v", e)
			}
		}
		lim := must[*fencegate.Client](t)(fencegate.NewWithOptions(url, fencegate.Options{APIKey: limitedKey}))
		must[*fencegate.WriteResult](t)(lim.Put(ctx, "mine/"+k, 1, fencegate.Token("1")))
		f := as[*fencegate.ForbiddenError](t, err2(lim.Put(ctx, "theirs/"+k, 1, fencegate.Token("1"))))
		if f.Status != 403 || f.Right != "write" || f.Name != "theirs/"+k {
			t.Fatalf("403: %+v", f)
		}
	})

	t.Run("token jump", func(t *testing.T) {
		must[*fencegate.WriteResult](t)(c.Put(ctx, "jump/"+k, 1, fencegate.Token("500")))
		j := as[*fencegate.TokenJumpError](t, err2(c.Put(ctx, "jump/"+k, 1, fencegate.Token("5000"))))
		if j.Presented != "5000" || j.Current != "500" || j.MaxJump != "1000" || j.Key != "jump/"+k {
			t.Fatalf("jump: %+v", j)
		}
	})

	t.Run("reserved scope before its first grant", func(t *testing.T) {
		scope := "reserved/" + k
		ni := as[*fencegate.TokenNotIssuedError](t, err2(c.Claim(ctx, scope, fencegate.Token("1"))))
		if ni.LatestIssued != "0" || ni.Scope != scope {
			t.Fatalf("not issued: %+v", ni)
		}
		l := must[*fencegate.Lease](t)(c.Lease(ctx, scope, fencegate.LeaseOptions{TTL: 5 * time.Second}))
		defer l.Release(context.Background())
		if w := must[*fencegate.WriteResult](t)(l.Put(ctx, scope+"/k", "fine")); w.FenceToken != l.Token() {
			t.Fatalf("lease write: %+v", w)
		}
	})

	t.Run("issuer proofs", func(t *testing.T) {
		scope := "hm/" + k
		as[*fencegate.MissingTokenProofError](t, err2(c.Put(ctx, scope+"/k", 1, fencegate.Token("3"), fencegate.Scope(scope))))
		ip := as[*fencegate.InvalidTokenProofError](t, err2(c.Put(ctx, scope+"/k", 1, fencegate.Token("3"), fencegate.Scope(scope),
			fencegate.Proof(fencegate.SignHMAC([]byte(hmacSecret), scope, "4")))))
		if ip.Status != 422 || !fencegate.IsFencing(ip) {
			t.Fatalf("invalid proof: %+v", ip)
		}
		must[*fencegate.WriteResult](t)(c.Put(ctx, scope+"/k", 1, fencegate.Token("3"), fencegate.Scope(scope),
			fencegate.Proof(fencegate.SignHMAC([]byte(hmacSecret), scope, "3"))))
		signed := must[*fencegate.Client](t)(fencegate.NewWithOptions(url, fencegate.Options{APIKey: adminKey,
			Signer: func(s, tok string) (string, error) { return fencegate.SignHMAC([]byte(hmacSecret), s, tok), nil }}))
		must[*fencegate.Fence](t)(signed.Claim(ctx, scope, fencegate.Token("7")))
		must[*fencegate.BatchResult](t)(signed.Batch(ctx, []fencegate.Op{fencegate.PutOp(scope+"/b", 2)}, fencegate.Token("7"), fencegate.Scope(scope)))
		escope := "ed/" + k + " café"
		as[*fencegate.InvalidTokenProofError](t, err2(c.Put(ctx, k+"/ed", 1, fencegate.Token("9"), fencegate.Scope(escope),
			fencegate.Proof(fencegate.SignHMAC([]byte(hmacSecret), escope, "9")))))
		w := must[*fencegate.WriteResult](t)(c.Put(ctx, k+"/ed", 1, fencegate.Token("9"), fencegate.Scope(escope),
			fencegate.Proof(fencegate.SignEd25519(edPriv, escope, "9"))))
		if w.Scope != escope {
			t.Fatalf("ed25519 write: %+v", w)
		}
		sh := as[*fencegate.ScopeHasIssuerError](t, err2(c.Acquire(ctx, scope, time.Second, "")))
		if sh.Scope != scope || sh.Issuer != "hm" {
			t.Fatalf("scope has issuer: %+v", sh)
		}
	})

	t.Run("binding conflict", func(t *testing.T) {
		as[*fencegate.ScopeMismatchError](t, err2(c.Put(ctx, "bound/"+k, 1, fencegate.Token("1"), fencegate.Scope("elsewhere"))))
		as[*fencegate.BindingConflictError](t, err2(c.RebindKeys(ctx, "bound/", "", "contradicts [[scopes]]")))
	})

	t.Run("tables", func(t *testing.T) {
		key := fencegate.Key("acme,"+k, 42) // a comma inside a value is encoded for you
		w := must[*fencegate.WriteResult](t)(c.TablePut(ctx, "orders", key, map[string]any{"amount": 10, "note": "first"}, fencegate.Token("3")))
		if !w.Created || w.FenceToken != "3" || w.Resource != "orders" {
			t.Fatalf("table put: %+v", w)
		}
		row := must[*fencegate.Row](t)(c.TableGet(ctx, "orders", key))
		if row.Row["amount"] != json.Number("10") || row.Row["tenant"] != "acme,"+k || row.FenceToken != "3" {
			t.Fatalf("row: %+v", row)
		}
		must[*fencegate.WriteResult](t)(c.TablePatch(ctx, "orders", key, map[string]any{"note": "patched"}, fencegate.Token("3")))
		st := as[*fencegate.StaleTokenError](t, err2(c.TablePut(ctx, "orders", key, map[string]any{"amount": 1}, fencegate.Token("2"))))
		if st.Resource != "orders" || st.Current != "3" || st.Presented != "2" {
			t.Fatalf("stale row: %+v", st)
		}
		iv := as[*fencegate.InvalidValueError](t, err2(c.TablePut(ctx, "orders", key, map[string]any{"amount": -1}, fencegate.Token("3"))))
		if iv.Status != 422 {
			t.Fatalf("invalid value: %+v", iv)
		}
		ir := as[*fencegate.InvalidRowError](t, err2(c.TablePut(ctx, "orders", key, map[string]any{"no_such_column": 1}, fencegate.Token("3"))))
		if ir.Column != "no_such_column" {
			t.Fatalf("invalid row: %+v", ir)
		}
		ik := as[*fencegate.InvalidKeyError](t, err2(c.TableGet(ctx, "orders", fencegate.Key("acme", "not-a-number"))))
		if ik.Column != "order_no" {
			t.Fatalf("invalid key: %+v", ik)
		}
		b := must[*fencegate.BatchResult](t)(c.Batch(ctx, []fencegate.Op{
			fencegate.TablePatchOp("orders", key, map[string]any{"amount": 11}), fencegate.PutOp("tables/"+k, 1)}, fencegate.Token("4")))
		if len(b.Results) != 2 || b.Results[0].Status != 200 || b.Results[1].Status != 201 || b.Results[0].Resource != "orders" {
			t.Fatalf("batch: %+v", b)
		}
		if d := must[*fencegate.DeleteResult](t)(c.TableDelete(ctx, "orders", key, fencegate.Token("4"))); !d.Deleted {
			t.Fatalf("delete: %+v", d)
		}
		as[*fencegate.NotFoundError](t, err2(c.TableGet(ctx, "orders", key)))
		as[*fencegate.NotFoundError](t, err2(c.TableGet(ctx, "no-such-resource", fencegate.Key(1))))
	})
}

func TestUnavailableWhenNotMigrated(t *testing.T) {
	s := startServer(t, "[database]\nmigrate_on_start = false\n", true)
	u := as[*fencegate.UnavailableError](t, fencegate.New(s.URL).Ready(ctx(t)))
	if u.Status != 503 || u.RetryAfter != "1" {
		t.Fatalf("unavailable: %+v", u)
	}
}

// The proofs this library signs are the ones `fencegate sign` prints.
func TestProofsMatchFencegateSign(t *testing.T) {
	bin := env(t, "FENCEGATE_BIN")
	keyFile := filepath.Join(t.TempDir(), "ed.key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(edPriv.Seed())), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ scope, token string }{{"jobs/a", "1"}, {"caf\u00e9 \u202e", fencegate.MaxToken}, {"x", "9007199254740993"}} {
		cmd := exec.Command(bin, "sign", "--scope", c.scope, "--token", c.token, "--hmac-secret-env", "GOTEST_FG_HMAC")
		cmd.Env = append(os.Environ(), "GOTEST_FG_HMAC="+hmacSecret)
		out, err := cmd.Output()
		if err != nil || strings.TrimSpace(string(out)) != fencegate.SignHMAC([]byte(hmacSecret), c.scope, c.token) {
			t.Fatalf("hmac %v: %q %v", c, out, err)
		}
		out, err = exec.Command(bin, "sign", "--scope", c.scope, "--token", c.token, "--ed25519-key-file", keyFile).Output()
		if err != nil || strings.TrimSpace(string(out)) != fencegate.SignEd25519(edPriv, c.scope, c.token) {
			t.Fatalf("ed25519 %v: %q %v", c, out, err)
		}
	}
}
