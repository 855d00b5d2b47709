package fencegate

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Version of this library, sent in the User-Agent.
const Version = "0.1.0"

// DefaultTimeout bounds each request (Options.Timeout changes it; contexts bound it further).
const DefaultTimeout = 30 * time.Second

// Options of NewWithOptions. The zero value is New's.
type Options struct {
	// APIKey (or a JWT) is sent as "Authorization: Bearer <APIKey>".
	APIKey string
	// CACertFile is a PEM bundle to trust instead of the system's roots (a private CA).
	CACertFile string
	// CertFile and KeyFile: a client certificate (PEM) for a server that asks for one (mTLS).
	CertFile, KeyFile string
	// HTTPClient to send with (its Transport, Timeout, Jar). Its CheckRedirect is replaced: a
	// redirect to another origin is never followed. Not allowed with CACertFile or CertFile.
	HTTPClient *http.Client
	// Timeout of each request (default DefaultTimeout; negative: none).
	Timeout time.Duration
	// Header is added to every request.
	Header http.Header
	// Signer returns the X-Fencing-Proof for every scoped write, claim and batch that does not
	// pass a Proof option: e.g. func(s, t string) (string, error) { return SignHMAC(secret, s, t), nil }.
	Signer func(scope, token string) (string, error)
	// Retries: how many times a write is sent again, with the same Idempotency-Key, after a lost
	// answer (a *TransportError) or a 503 with Retry-After, within Timeout and the context
	// (0: DefaultRetries; negative: never).
	Retries int
}

// DefaultRetries is how many times a write is retried with its Idempotency-Key by default.
const DefaultRetries = 2

// Client of one fencegate server. Safe for concurrent use.
type Client struct {
	base   *url.URL
	http   *http.Client
	apiKey string
	header http.Header
	signer func(scope, token string) (string, error)
	err    error // from New: returned by every call
	// retries and budget bound the retries of a keyed write (Options.Retries, the timeout).
	retries int
	budget  time.Duration
}

// New is a client of the fencegate at rawURL (e.g. "http://127.0.0.1:8080") with no
// credential. A malformed URL is reported by every call.
func New(rawURL string) *Client {
	c, err := NewWithOptions(rawURL, Options{})
	if err != nil {
		return &Client{err: err, http: http.DefaultClient, base: &url.URL{}}
	}
	return c
}

// NewFromEnv reads FENCEGATE_URL (default http://127.0.0.1:8080), FENCEGATE_API_KEY and
// FENCEGATE_CACERT, as the command line does.
func NewFromEnv() (*Client, error) {
	u := os.Getenv("FENCEGATE_URL")
	if u == "" {
		u = "http://127.0.0.1:8080"
	}
	return NewWithOptions(u, Options{APIKey: os.Getenv("FENCEGATE_API_KEY"), CACertFile: os.Getenv("FENCEGATE_CACERT")})
}

// NewWithOptions is a client of the fencegate at rawURL with these options.
func NewWithOptions(rawURL string, o Options) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(rawURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("fencegate: bad URL %q: %w", rawURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("fencegate: bad URL %q: want http(s)://host:port", rawURL)
	}
	c := &Client{base: u, apiKey: o.APIKey, header: o.Header.Clone(), signer: o.Signer, retries: o.Retries}
	if c.retries == 0 {
		c.retries = DefaultRetries
	} else if c.retries < 0 {
		c.retries = 0
	}
	if o.HTTPClient != nil {
		if o.CACertFile != "" || o.CertFile != "" {
			return nil, errors.New("fencegate: set CACertFile/CertFile on your HTTPClient's transport, or leave HTTPClient unset")
		}
		hc := *o.HTTPClient
		c.http = &hc
	} else {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if o.CACertFile != "" || o.CertFile != "" {
			cfg := &tls.Config{MinVersion: tls.VersionTLS12}
			if o.CACertFile != "" {
				pem, err := os.ReadFile(o.CACertFile)
				if err != nil {
					return nil, fmt.Errorf("fencegate: CA file: %w", err)
				}
				pool := x509.NewCertPool()
				if !pool.AppendCertsFromPEM(pem) {
					return nil, fmt.Errorf("fencegate: CA file %s holds no PEM certificate", o.CACertFile)
				}
				cfg.RootCAs = pool
			}
			if o.CertFile != "" {
				cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
				if err != nil {
					return nil, fmt.Errorf("fencegate: client certificate: %w", err)
				}
				cfg.Certificates = []tls.Certificate{cert}
			}
			tr.TLSClientConfig = cfg
		}
		timeout := o.Timeout
		if timeout == 0 {
			timeout = DefaultTimeout
		} else if timeout < 0 {
			timeout = 0
		}
		c.http = &http.Client{Transport: tr, Timeout: timeout}
	}
	c.http.CheckRedirect = sameOriginOnly
	c.budget = c.http.Timeout
	if c.budget <= 0 {
		c.budget = DefaultTimeout
	}
	return c, nil
}

// sameOriginOnly follows a redirect only to the origin (scheme, host and port) of the request
// that was sent: a token, a scope, a credential or a body never goes anywhere else.
func sameOriginOnly(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	first := via[0].URL
	if req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
		return fmt.Errorf("%w: %s", ErrCrossOriginRedirect, req.URL.Redacted())
	}
	return nil
}

// URL of the server.
func (c *Client) URL() string { return c.base.String() }

// ---- options of a call --------------------------------------------------------------------

// Option of a write: Token (required for writes), Scope, Proof, IdempotencyKey, Header.
type Option func(*callOpts)

type callOpts struct {
	token, scope, proof, idempotencyKey string
	header                              http.Header
}

// IdempotencyKey sets the Idempotency-Key of a write (1..=255 visible ASCII characters). Without
// it each write gets a fresh one (NewIdempotencyKey); either way its retries send the same key.
func IdempotencyKey(k string) Option { return func(o *callOpts) { o.idempotencyKey = k } }

// NewIdempotencyKey is 128 random bits from crypto/rand as 32 hex digits.
func NewIdempotencyKey() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic("fencegate: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}

func checkIdempotencyKey(k string) error {
	if len(k) < 1 || len(k) > 255 {
		return errors.New("fencegate: an idempotency key is 1..=255 visible ASCII characters")
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return errors.New("fencegate: an idempotency key is 1..=255 visible ASCII characters")
		}
	}
	return nil
}

// Token sets the X-Fencing-Token of a write: a canonical decimal string (see CheckToken and
// the adapters EtcdRevision, ZooKeeperSequence, RedisIncr).
func Token(t string) Option { return func(o *callOpts) { o.token = t } }

// Scope sets the X-Fencing-Scope of a write: the lock's name, so one fence guards every key
// written under the lock.
func Scope(s string) Option { return func(o *callOpts) { o.scope = s } }

// Proof sets the X-Fencing-Proof of a write (an issuer's signature; see SignHMAC).
func Proof(p string) Option { return func(o *callOpts) { o.proof = p } }

// Header adds a header to one call.
func Header(name, value string) Option {
	return func(o *callOpts) {
		if o.header == nil {
			o.header = http.Header{}
		}
		o.header.Add(name, value)
	}
}

func collect(opts []Option) callOpts {
	var o callOpts
	for _, f := range opts {
		f(&o)
	}
	return o
}

// ---- plumbing -----------------------------------------------------------------------------

// Segment is a key, scope or lock name as one path segment (and as X-Fencing-Scope).
func Segment(name string) string { return url.PathEscape(name) }

func checkName(what, name string) error {
	if name == "" {
		return fmt.Errorf("fencegate: a %s must not be empty", what)
	}
	return nil
}

var noBody = &struct{}{}

func encodeJSON(v any) ([]byte, error) {
	if raw, ok := v.(json.RawMessage); ok {
		if !json.Valid(raw) {
			return nil, errors.New("fencegate: json.RawMessage value is not valid JSON")
		}
		return raw, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("fencegate: encoding the body: %w", err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// Response is a 2xx answer of Do.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Do sends any request (path like "/v1/kv/k", already encoded; body nil for none, else any
// JSON value or json.RawMessage) with the client's credential, and returns a 2xx answer or the
// typed error of any other. The fencing headers of opts are sent as given (not checked).
func (c *Client) Do(ctx context.Context, method, path string, body any, opts ...Option) (*Response, error) {
	o := collect(opts)
	h := http.Header{}
	if o.token != "" {
		h.Set("X-Fencing-Token", o.token)
	}
	if o.scope != "" {
		h.Set("X-Fencing-Scope", Segment(o.scope))
	}
	if o.proof != "" {
		h.Set("X-Fencing-Proof", o.proof)
	}
	for k, v := range o.header {
		h[k] = v
	}
	b := any(noBody)
	if body != nil {
		b = body
	}
	return c.send(ctx, method, path, b, h)
}

func (c *Client) send(ctx context.Context, method, path string, body any, h http.Header) (*Response, error) {
	if c.err != nil {
		return nil, c.err
	}
	var rd io.Reader
	var data []byte
	if body != noBody {
		var err error
		if data, err = encodeJSON(body); err != nil {
			return nil, err
		}
		rd = bytes.NewReader(data)
	}
	full := c.base.String() + path
	req, err := http.NewRequestWithContext(ctx, method, full, rd)
	if err != nil {
		return nil, fmt.Errorf("fencegate: %s %s: %w", method, full, err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
		if len(data) > 64<<10 {
			// The server refuses a body over its limit (413) before reading it: asking first
			// gets that answer instead of a connection closed mid-body.
			req.Header.Set("Expect", "100-continue")
		}
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "fencegate-go/"+Version)
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if host := h.Get("Host"); host != "" {
		req.Host = host
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, &TransportError{Method: method, URL: full, Err: ctx.Err()}
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, &TransportError{Method: method, URL: full, Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, &TransportError{Method: method, URL: full, Err: err}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, ParseProblem(resp.StatusCode, resp.Header, raw)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: raw}, nil
}

// sendKeyed sends a write carrying an Idempotency-Key (in h) and, when its answer is lost or it
// gets a 503 with Retry-After, sends it again with the same key: at most c.retries times, while
// the client's timeout and the context leave room. Safe because the server answers a retry of a
// write that landed with its first outcome (Idempotent-Replayed: true), never a second write.
func (c *Client) sendKeyed(ctx context.Context, method, path string, body any, h http.Header) (*Response, error) {
	deadline := time.Now().Add(c.budget)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for attempt := 0; ; attempt++ {
		r, err := c.send(ctx, method, path, body, h)
		if err == nil || attempt >= c.retries || ctx.Err() != nil {
			return r, err
		}
		var pause time.Duration
		var te *TransportError
		var ue *UnavailableError
		switch {
		case errors.As(err, &ue):
			secs, perr := strconv.ParseFloat(ue.RetryAfter, 64)
			if perr != nil || secs < 0 {
				return r, err
			}
			pause = time.Duration(secs * float64(time.Second))
		case errors.As(err, &te):
			pause = time.Duration(float64(100*time.Millisecond<<attempt) * (0.8 + 0.4*mathrand.Float64()))
		default:
			return r, err
		}
		if time.Now().Add(pause).After(deadline) {
			return r, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return r, err
		case <-t.C:
		}
	}
}

func replayed(r *Response) bool {
	return strings.EqualFold(r.Header.Get("Idempotent-Replayed"), "true")
}

// fenced: a write's headers (token checked, scope encoded, proof signed when a signer is set).
func (c *Client) fenced(o callOpts) (http.Header, error) {
	key := o.idempotencyKey
	if key == "" {
		key = NewIdempotencyKey()
	} else if err := checkIdempotencyKey(key); err != nil {
		return nil, err
	}
	if o.token == "" {
		// Sent without one: the server answers 428 (MissingTokenError), typed like any refusal.
		h := http.Header{"Idempotency-Key": {key}}
		if o.scope != "" {
			h.Set("X-Fencing-Scope", Segment(o.scope))
		}
		return h, nil
	}
	if err := CheckToken(o.token); err != nil {
		return nil, err
	}
	h := http.Header{"X-Fencing-Token": {o.token}, "Idempotency-Key": {key}}
	if o.scope != "" {
		h.Set("X-Fencing-Scope", Segment(o.scope))
		if o.proof == "" && c.signer != nil {
			p, err := c.signer(o.scope, o.token)
			if err != nil {
				return nil, fmt.Errorf("fencegate: signing the proof: %w", err)
			}
			o.proof = p
		}
	}
	if o.proof != "" {
		h.Set("X-Fencing-Proof", o.proof)
	}
	for k, v := range o.header {
		h[k] = v
	}
	return h, nil
}

func decodeMap(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("fencegate: unexpected answer %.200q: %w", b, err)
	}
	return m, nil
}

func str(m map[string]any, k string) string {
	switch v := m[k].(type) {
	case string:
		return v
	case json.Number:
		return v.String()
	}
	return ""
}

func num(m map[string]any, k string) int64 {
	switch v := m[k].(type) {
	case json.Number:
		i, _ := v.Int64()
		return i
	case string:
		i, _ := strconv.ParseInt(v, 10, 64)
		return i
	}
	return 0
}

// ---- results ------------------------------------------------------------------------------

// Tokens in results are strings of decimals, exactly as the server sent them. Scope "" means
// none. Raw holds the whole answer (numbers as json.Number).

// WriteResult of a kv or table PUT/PATCH: Created for a 201.
type WriteResult struct {
	Key, FenceToken, Scope, Resource string
	Created                          bool
	Version                          int64
	// Replayed: the server answered a retry with this write's first outcome (it landed earlier).
	Replayed bool
	Raw      map[string]any
}

// Entry is a key's value and fence (GET /v1/kv/{key}).
type Entry struct {
	Key        string
	Value      json.RawMessage
	FenceToken string
	Scope      string
	Version    int64
	UpdatedAt  string
	Raw        map[string]any
}

// Decode the value into v (json.Unmarshal).
func (e *Entry) Decode(v any) error { return json.Unmarshal(e.Value, v) }

// DeleteResult of a delete: the tombstone keeps the fence.
type DeleteResult struct {
	Key, FenceToken, Scope, Resource string
	Deleted                          bool
	// Replayed: the server answered a retry with this write's first outcome (it landed earlier).
	Replayed bool
	Raw      map[string]any
}

// OpResult of one batch op.
type OpResult struct {
	Op, Key, Resource string
	Status            int
}

// BatchResult of an all-or-nothing batch.
type BatchResult struct {
	FenceToken, Scope string
	Results           []OpResult
	// Replayed: the server answered a retry with this batch's first outcome.
	Replayed bool
	Raw      map[string]any
}

// Fence of a scope; Created for a 201 claim.
type Fence struct {
	Scope, FenceToken string
	Created           bool
	// Replayed: the server answered a retried claim with its first outcome.
	Replayed bool
	Raw      map[string]any
}

// Grant of the built-in lock service (a grant or a renew).
type Grant struct {
	Name, Token, Owner, ExpiresAt, Scope string
	TTL                                  time.Duration
	Raw                                  map[string]any
}

// Holder of a built-in lock (its token is never shown).
type Holder struct {
	Name, Owner string
	Remaining   time.Duration
	Raw         map[string]any
}

// Row of a legacy table; values as decoded JSON (numbers as json.Number).
type Row struct {
	Resource, Key, FenceToken, Scope string
	Row                              map[string]any
	Raw                              map[string]any
}

// AdminResult of a reset, retire or rebind.
type AdminResult struct {
	Target, Name, Resource, From, To, AuditID string
	Raw                                       map[string]any
}

// ---- kv -----------------------------------------------------------------------------------

func (c *Client) write(ctx context.Context, method, path string, body any, opts []Option) (*Response, map[string]any, error) {
	h, err := c.fenced(collect(opts))
	if err != nil {
		return nil, nil, err
	}
	r, err := c.sendKeyed(ctx, method, path, body, h)
	if err != nil {
		return nil, nil, err
	}
	m, err := decodeMap(r.Body)
	return r, m, err
}

func writeResult(r *Response, m map[string]any) *WriteResult {
	return &WriteResult{Key: str(m, "key"), FenceToken: str(m, "fence_token"), Scope: str(m, "scope"),
		Resource: str(m, "resource"), Created: r.Status == 201, Version: num(m, "version"), Replayed: replayed(r), Raw: m}
}

func deleteResult(r *Response, m map[string]any) *DeleteResult {
	d := &DeleteResult{Key: str(m, "key"), FenceToken: str(m, "fence_token"), Scope: str(m, "scope"),
		Resource: str(m, "resource"), Deleted: true, Replayed: replayed(r), Raw: m}
	if v, ok := m["deleted"].(bool); ok {
		d.Deleted = v
	}
	return d
}

// Put writes value (any JSON value; json.RawMessage for JSON text) to key, with Token(..) and
// optionally Scope(..). A stale token is *StaleTokenError.
func (c *Client) Put(ctx context.Context, key string, value any, opts ...Option) (*WriteResult, error) {
	if err := checkName("key", key); err != nil {
		return nil, err
	}
	r, m, err := c.write(ctx, "PUT", "/v1/kv/"+Segment(key), value, opts)
	if err != nil {
		return nil, err
	}
	return writeResult(r, m), nil
}

// Get reads a key; *NotFoundError if it is absent or deleted.
func (c *Client) Get(ctx context.Context, key string) (*Entry, error) {
	if err := checkName("key", key); err != nil {
		return nil, err
	}
	r, err := c.send(ctx, "GET", "/v1/kv/"+Segment(key), noBody, nil)
	if err != nil {
		return nil, err
	}
	m, err := decodeMap(r.Body)
	if err != nil {
		return nil, err
	}
	var v struct {
		Value json.RawMessage `json:"value"`
	}
	_ = json.Unmarshal(r.Body, &v)
	return &Entry{Key: str(m, "key"), Value: v.Value, FenceToken: str(m, "fence_token"), Scope: str(m, "scope"),
		Version: num(m, "version"), UpdatedAt: str(m, "updated_at"), Raw: m}, nil
}

// Delete deletes a key under Token(..) (and Scope(..)); its tombstone keeps the fence.
func (c *Client) Delete(ctx context.Context, key string, opts ...Option) (*DeleteResult, error) {
	if err := checkName("key", key); err != nil {
		return nil, err
	}
	r, m, err := c.write(ctx, "DELETE", "/v1/kv/"+Segment(key), noBody, opts)
	if err != nil {
		return nil, err
	}
	return deleteResult(r, m), nil
}

// Op is one operation of a batch: PutOp, DeleteOp, TablePutOp, TablePatchOp, TableDeleteOp.
type Op map[string]any

// PutOp writes value to key.
func PutOp(key string, value any) Op { return Op{"op": "put", "key": key, "value": value} }

// DeleteOp deletes key.
func DeleteOp(key string) Op { return Op{"op": "delete", "key": key} }

// TablePutOp replaces a table row.
func TablePutOp(resource string, key RowKey, row map[string]any) Op {
	return Op{"op": "put", "resource": resource, "key": string(key), "row": row}
}

// TablePatchOp updates columns of a table row.
func TablePatchOp(resource string, key RowKey, row map[string]any) Op {
	return Op{"op": "patch", "resource": resource, "key": string(key), "row": row}
}

// TableDeleteOp deletes a table row.
func TableDeleteOp(resource string, key RowKey) Op {
	return Op{"op": "delete", "resource": resource, "key": string(key)}
}

// Batch applies ops all or nothing under one Token(..) (and Scope(..)). A stale key refuses
// the whole batch with *StaleTokenError naming every stale key.
func (c *Client) Batch(ctx context.Context, ops []Op, opts ...Option) (*BatchResult, error) {
	if ops == nil {
		ops = []Op{}
	}
	r, m, err := c.write(ctx, "POST", "/v1/batch", map[string]any{"ops": ops}, opts)
	if err != nil {
		return nil, err
	}
	b := &BatchResult{FenceToken: str(m, "fence_token"), Scope: str(m, "scope"), Replayed: replayed(r), Raw: m}
	if list, ok := m["results"].([]any); ok {
		for _, it := range list {
			if r, ok := it.(map[string]any); ok {
				b.Results = append(b.Results, OpResult{Op: str(r, "op"), Key: str(r, "key"), Resource: str(r, "resource"), Status: int(num(r, "status"))})
			}
		}
	}
	return b, nil
}

// ---- fences -------------------------------------------------------------------------------

func fenceOf(r *Response, m map[string]any) *Fence {
	return &Fence{Scope: str(m, "scope"), FenceToken: str(m, "fence_token"), Created: r.Status == 201, Raw: m}
}

// Claim raises scope's fence to Token(..) without writing data: every holder of an older token
// is fenced from now on. Call it right after your own lock service granted you a token.
func (c *Client) Claim(ctx context.Context, scope string, opts ...Option) (*Fence, error) {
	if err := checkName("scope", scope); err != nil {
		return nil, err
	}
	o := collect(opts)
	o.scope = scope
	h, err := c.fenced(o)
	if err != nil {
		return nil, err
	}
	h.Del("X-Fencing-Scope")
	r, err := c.sendKeyed(ctx, "POST", "/v1/fences/"+Segment(scope), noBody, h)
	if err != nil {
		return nil, err
	}
	m, err := decodeMap(r.Body)
	if err != nil {
		return nil, err
	}
	f := fenceOf(r, m)
	f.Replayed = replayed(r)
	return f, nil
}

// Fence reads a scope's fence; *NotFoundError if it has none.
func (c *Client) Fence(ctx context.Context, scope string) (*Fence, error) {
	if err := checkName("scope", scope); err != nil {
		return nil, err
	}
	r, err := c.send(ctx, "GET", "/v1/fences/"+Segment(scope), noBody, nil)
	if err != nil {
		return nil, err
	}
	m, err := decodeMap(r.Body)
	if err != nil {
		return nil, err
	}
	return fenceOf(r, m), nil
}

// ---- the built-in lock service --------------------------------------------------------------

func grantOf(m map[string]any) *Grant {
	g := &Grant{Name: str(m, "name"), Token: str(m, "token"), Owner: str(m, "owner"), ExpiresAt: str(m, "expires_at"),
		Scope: str(m, "scope"), TTL: time.Duration(num(m, "ttl_ms")) * time.Millisecond, Raw: m}
	if g.Scope == "" {
		g.Scope = g.Name
	}
	return g
}

func (c *Client) lockCall(ctx context.Context, method, path string, body any, token string) (map[string]any, error) {
	h := http.Header{}
	if token != "" {
		if err := CheckToken(token); err != nil {
			return nil, err
		}
		h.Set("X-Fencing-Token", token)
	}
	r, err := c.send(ctx, method, path, body, h)
	if err != nil {
		return nil, err
	}
	return decodeMap(r.Body)
}

// ttlMs: whole milliseconds (a TTL under 1ms is sent as 0, which the server refuses).
func ttlMs(ttl time.Duration) int64 { return ttl.Milliseconds() }

// Acquire takes the built-in lock once (*LockHeldError if it is held). Prefer Lease, which
// renews it and tells you when it is lost.
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration, owner string) (*Grant, error) {
	if err := checkName("lock name", name); err != nil {
		return nil, err
	}
	if owner == "" {
		owner = defaultOwner()
	}
	m, err := c.lockCall(ctx, "POST", "/v1/locks/"+Segment(name), map[string]any{"owner": owner, "ttl_ms": ttlMs(ttl)}, "")
	if err != nil {
		return nil, err
	}
	return grantOf(m), nil
}

// Renew a lease of the built-in lock; *LockLostError if it is no longer yours.
func (c *Client) Renew(ctx context.Context, name, token string, ttl time.Duration) (*Grant, error) {
	m, err := c.lockCall(ctx, "POST", "/v1/locks/"+Segment(name)+"/renew", map[string]any{"ttl_ms": ttlMs(ttl)}, token)
	if err != nil {
		return nil, err
	}
	return grantOf(m), nil
}

// ReleaseLock releases a lease of the built-in lock; *LockLostError if it was not yours.
func (c *Client) ReleaseLock(ctx context.Context, name, token string) error {
	_, err := c.lockCall(ctx, "DELETE", "/v1/locks/"+Segment(name), noBody, token)
	return err
}

// Holder of the built-in lock, or nil when it is free.
func (c *Client) Holder(ctx context.Context, name string) (*Holder, error) {
	m, err := c.lockCall(ctx, "GET", "/v1/locks/"+Segment(name), noBody, "")
	var nf *NotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &Holder{Name: str(m, "name"), Owner: str(m, "owner"), Remaining: time.Duration(num(m, "remaining_ms")) * time.Millisecond, Raw: m}, nil
}

// ---- legacy tables ------------------------------------------------------------------------

// RowKey is a table row's key as it goes in the URL: the key columns' values, each
// percent-encoded, joined by ",". Make one with Key.
type RowKey string

// Key is the RowKey of the key columns' values, in the order of the resource's `key = [...]`:
// Key("acme", 42).
func Key(values ...any) RowKey {
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = url.PathEscape(fmt.Sprint(v))
		parts[i] = strings.ReplaceAll(parts[i], ",", "%2C")
	}
	return RowKey(strings.Join(parts, ","))
}

func tablePath(resource string, key RowKey) string {
	return "/v1/tables/" + Segment(resource) + "/" + string(key)
}

// TableGet reads a row of a configured legacy table.
func (c *Client) TableGet(ctx context.Context, resource string, key RowKey) (*Row, error) {
	r, err := c.send(ctx, "GET", tablePath(resource, key), noBody, nil)
	if err != nil {
		return nil, err
	}
	m, err := decodeMap(r.Body)
	if err != nil {
		return nil, err
	}
	row, _ := m["row"].(map[string]any)
	return &Row{Resource: str(m, "resource"), Key: str(m, "key"), FenceToken: str(m, "fence_token"), Scope: str(m, "scope"), Row: row, Raw: m}, nil
}

// TablePut replaces a row (columns not given get their defaults) under Token(..).
func (c *Client) TablePut(ctx context.Context, resource string, key RowKey, row map[string]any, opts ...Option) (*WriteResult, error) {
	r, m, err := c.write(ctx, "PUT", tablePath(resource, key), row, opts)
	if err != nil {
		return nil, err
	}
	return writeResult(r, m), nil
}

// TablePatch updates the given columns of an existing row under Token(..).
func (c *Client) TablePatch(ctx context.Context, resource string, key RowKey, row map[string]any, opts ...Option) (*WriteResult, error) {
	r, m, err := c.write(ctx, "PATCH", tablePath(resource, key), row, opts)
	if err != nil {
		return nil, err
	}
	return writeResult(r, m), nil
}

// TableDelete deletes a row under Token(..); its tombstone keeps the fence.
func (c *Client) TableDelete(ctx context.Context, resource string, key RowKey, opts ...Option) (*DeleteResult, error) {
	r, m, err := c.write(ctx, "DELETE", tablePath(resource, key), noBody, opts)
	if err != nil {
		return nil, err
	}
	return deleteResult(r, m), nil
}

// ---- admin (the admin right) --------------------------------------------------------------

func (c *Client) admin(ctx context.Context, path string, body map[string]any) (*AdminResult, error) {
	r, err := c.send(ctx, "POST", path, body, nil)
	if err != nil {
		return nil, err
	}
	m, err := decodeMap(r.Body)
	if err != nil {
		return nil, err
	}
	name := str(m, "name")
	if name == "" {
		name = str(m, "prefix")
	}
	return &AdminResult{Target: str(m, "target"), Name: name, Resource: str(m, "resource"), From: str(m, "from"),
		To: str(m, "to"), AuditID: str(m, "audit_id"), Raw: m}, nil
}

// ResetFence lowers a scope's fence to `to` (audited).
func (c *Client) ResetFence(ctx context.Context, scope, to, reason string) (*AdminResult, error) {
	if err := CheckToken(to); err != nil {
		return nil, err
	}
	return c.admin(ctx, "/v1/admin/fences/"+Segment(scope)+"/reset", map[string]any{"to": to, "reason": reason})
}

// ResetKey lowers a key's fence to `to` ("": leave it) and, when rebind is true, binds it to
// scope ("": unscoped). Audited.
func (c *Client) ResetKey(ctx context.Context, key, to string, rebind bool, scope, reason string) (*AdminResult, error) {
	body := map[string]any{"reason": reason}
	if to != "" {
		if err := CheckToken(to); err != nil {
			return nil, err
		}
		body["to"] = to
	}
	if rebind {
		if scope == "" {
			body["scope"] = nil
		} else {
			body["scope"] = scope
		}
	}
	return c.admin(ctx, "/v1/admin/kv/"+Segment(key)+"/reset", body)
}

// RetireLock ends a built-in lock's lease and stops its grants speaking for the scope (audited).
func (c *Client) RetireLock(ctx context.Context, name, reason string) (*AdminResult, error) {
	return c.admin(ctx, "/v1/admin/locks/"+Segment(name)+"/retire", map[string]any{"reason": reason})
}

// RebindKeys binds every key under prefix to scope ("": unscoped). Audited.
func (c *Client) RebindKeys(ctx context.Context, prefix, scope, reason string) (*AdminResult, error) {
	var s any
	if scope != "" {
		s = scope
	}
	return c.admin(ctx, "/v1/admin/kv/rebind", map[string]any{"prefix": prefix, "scope": s, "reason": reason})
}

// ---- probes -------------------------------------------------------------------------------

// Health is GET /healthz.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.send(ctx, "GET", "/healthz", noBody, nil)
	return err
}

// Ready is GET /readyz: nil when ready, else *UnavailableError saying why.
func (c *Client) Ready(ctx context.Context) error {
	_, err := c.send(ctx, "GET", "/readyz", noBody, nil)
	return err
}

func defaultOwner() string {
	h, _ := os.Hostname()
	if h == "" {
		h = "go"
	}
	return h + ":" + strconv.Itoa(os.Getpid())
}
