package fencegate_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	fencegate "github.com/fencegate/fencegate/clients/go"
)

// writeCA makes a private CA and a server certificate for 127.0.0.1 and localhost signed by it.
func writeCA(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey := must[*ecdsa.PrivateKey](t)(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fencegate test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true}
	caDER := must[[]byte](t)(x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey))
	ca := must[*x509.Certificate](t)(x509.ParseCertificate(caDER))
	key := must[*ecdsa.PrivateKey](t)(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
	der := must[[]byte](t)(x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey))
	pkcs8 := must[[]byte](t)(x509.MarshalPKCS8PrivateKey(key))
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func(path, typ string, b []byte) {
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(caFile, "CERTIFICATE", caDER)
	write(certFile, "CERTIFICATE", der)
	write(keyFile, "PRIVATE KEY", pkcs8)
	return
}

// A fencegate serving HTTPS with a private CA's certificate: trusted with the CA option only.
func TestCACertFileTrustsAPrivateCA(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeCA(t, dir)
	s := startServer(t, "[server.tls]\ncert_file = \""+certFile+"\"\nkey_file = \""+keyFile+"\"\n", true)
	url := strings.Replace(s.URL, "http://", "https://", 1)
	c := must[*fencegate.Client](t)(fencegate.NewWithOptions(url, fencegate.Options{CACertFile: caFile}))
	ctx, k := ctx(t), name(t)
	if err := c.Health(ctx); err != nil {
		t.Fatalf("health over TLS: %v", err)
	}
	must[*fencegate.WriteResult](t)(c.Put(ctx, k, "over tls", fencegate.Token("1")))
	as[*fencegate.StaleTokenError](t, err2(c.Put(ctx, k, "stale", fencegate.Token("0"))))
	// without the CA: the system's roots do not know it
	te := as[*fencegate.TransportError](t, fencegate.New(url).Health(ctx))
	var unknown x509.UnknownAuthorityError
	if !errors.As(te, &unknown) && !strings.Contains(te.Error(), "certificate") {
		t.Fatalf("want a certificate error, got %v", te)
	}
	if _, err := fencegate.NewWithOptions(url, fencegate.Options{CACertFile: filepath.Join(dir, "none.pem")}); err == nil {
		t.Fatal("a missing CA file must fail")
	}
	if _, err := fencegate.NewWithOptions(url, fencegate.Options{CACertFile: keyFile}); err == nil {
		t.Fatal("a CA file with no certificate must fail")
	}
}

// A redirect to another origin is never followed: no token, scope, credential or body leaves.
// One to the same origin is followed with them.
func TestRedirectsToAnotherOriginAreRefused(t *testing.T) {
	var mu sync.Mutex
	var elsewhere []*http.Request
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		elsewhere = append(elsewhere, r)
		mu.Unlock()
		w.WriteHeader(200)
		_, _ = io.WriteString(w, `{"key":"k","fence_token":"1"}`)
	}))
	defer other.Close()
	var seen []string
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.URL.Path+" "+r.Header.Get("X-Fencing-Token")+" "+r.Header.Get("X-Fencing-Scope")+" "+string(body))
		mu.Unlock()
		switch r.URL.Path {
		case "/v1/kv/away":
			http.Redirect(w, r, other.URL+"/v1/kv/away", http.StatusTemporaryRedirect)
		case "/v1/kv/moved":
			http.Redirect(w, r, "/v1/kv/here", http.StatusPermanentRedirect)
		default:
			w.WriteHeader(201)
			_, _ = io.WriteString(w, `{"key":"here","fence_token":"7","scope":"s"}`)
		}
	}))
	defer origin.Close()
	c := must[*fencegate.Client](t)(fencegate.NewWithOptions(origin.URL, fencegate.Options{APIKey: "secret"}))
	err := err2(c.Put(ctx(t), "away", map[string]any{"v": 1}, fencegate.Token("7"), fencegate.Scope("s")))
	te := as[*fencegate.TransportError](t, err)
	if !errors.Is(te, fencegate.ErrCrossOriginRedirect) {
		t.Fatalf("want ErrCrossOriginRedirect, got %v", te)
	}
	mu.Lock()
	n := len(elsewhere)
	mu.Unlock()
	if n != 0 {
		t.Fatalf("the other origin got %d requests", n)
	}
	w := must[*fencegate.WriteResult](t)(c.Put(ctx(t), "moved", map[string]any{"v": 2}, fencegate.Token("7"), fencegate.Scope("s")))
	if w.Key != "here" || !w.Created {
		t.Fatalf("same-origin redirect: %+v", w)
	}
	mu.Lock()
	defer mu.Unlock()
	if last := seen[len(seen)-1]; last != `/v1/kv/here 7 s {"v":2}` {
		t.Fatalf("the followed request: %q", last)
	}
}
