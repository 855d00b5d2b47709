package fencegate

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// ProblemBase is the prefix of every problem type URI fencegate sends.
const ProblemBase = "https://fencegate.dev/problems/"

// Problem is what every error answered by the server carries: the RFC 9457 fields, the whole
// decoded body (Body, for fields this version does not name) and the response's headers.
// Each problem type has its own error type embedding Problem (StaleTokenError,
// ScopeMismatchError, ...): match them with errors.As. AsProblem gives the Problem of any of them.
type Problem struct {
	Status int            // the HTTP status
	Type   string         // the problem type URI, e.g. https://fencegate.dev/problems/stale-token
	Slug   string         // its last segment, e.g. "stale-token"
	Title  string         // the type's title
	Detail string         // what happened, for people
	Body   map[string]any // the whole problem object (tokens in it are strings)
	Header http.Header    // the response's headers
}

func (p *Problem) Error() string {
	head := fmt.Sprintf("fencegate: %d", p.Status)
	if p.Slug != "" {
		head += " " + p.Slug
	}
	text := p.Detail
	if text == "" {
		text = p.Title
	}
	if text == "" {
		return head
	}
	return head + ": " + text
}

// RequestID is the X-Request-Id of the refused request (what fencegate logged under).
func (p *Problem) RequestID() string { return p.Header.Get("X-Request-Id") }

func (p *Problem) problem() *Problem { return p }

// str is a string field of the problem body ("" when absent or null). Tokens are strings on
// the wire; a number (a server that sends one) is kept as its exact decimal text.
func (p *Problem) str(field string) string {
	switch v := p.Body[field].(type) {
	case string:
		return v
	case json.Number:
		return v.String()
	default:
		return ""
	}
}

func (p *Problem) int64(field string) int64 {
	if n, ok := p.Body[field].(json.Number); ok {
		i, _ := n.Int64()
		return i
	}
	return 0
}

type problemer interface {
	error
	problem() *Problem
}

// AsProblem returns the Problem of any error the server answered with (whatever its type).
func AsProblem(err error) (*Problem, bool) {
	var p problemer
	if errors.As(err, &p) {
		return p.problem(), true
	}
	return nil, false
}

// StaleKey is one stale key of a refused batch.
type StaleKey struct {
	Key      string
	Resource string // for a table row
	Current  string // the fence the key's write ran into
}

// ---- the refusals that mean "this writer must stop" --------------------------------------------

// StaleTokenError (412 stale-token): Presented is below the fence Current of Key (or Scope;
// Resource and Key for a table row). A newer holder exists: stop working. For a batch,
// StaleKeys lists every stale key.
type StaleTokenError struct {
	Problem
	Presented, Current   string
	Key, Scope, Resource string
	StaleKeys            []StaleKey
}

// ScopeMismatchError (409 scope-mismatch): Key (or Resource and Key) is bound to Scope ("":
// unscoped) and the write came under PresentedScope ("": none).
type ScopeMismatchError struct {
	Problem
	Key, Resource, Scope, PresentedScope string
}

// TokenNotIssuedError (422 token-not-issued): under a built-in lock's Scope, Presented is above
// LatestIssued, the latest token that lock granted.
type TokenNotIssuedError struct {
	Problem
	Scope, Key, Presented, LatestIssued string
}

// TokenJumpError (422 token-jump): Presented exceeds the fence Current by more than MaxJump.
type TokenJumpError struct {
	Problem
	Key, Scope, Resource, Presented, Current, MaxJump string
}

// MissingTokenProofError (422 missing-token-proof): the scope belongs to an [[issuers]] entry;
// send its X-Fencing-Proof (the Proof option, or Options.Signer).
type MissingTokenProofError struct{ Problem }

// InvalidTokenProofError (422 invalid-token-proof): the proof does not verify for this scope
// and token.
type InvalidTokenProofError struct{ Problem }

// LockLostError (409 lock-lost): a renew or release by someone who no longer holds the lease;
// Holder and RemainingMs name the current holder, if any.
type LockLostError struct {
	Problem
	Holder      string
	RemainingMs int64
}

// ---- 409 ------------------------------------------------------------------------------------

// LockHeldError (409 lock-held): Holder holds the lock for RemainingMs more.
type LockHeldError struct {
	Problem
	Holder      string
	RemainingMs int64
}

// LockExhaustedError (409 lock-exhausted): the lock's scope is at the largest token.
type LockExhaustedError struct{ Problem }

// ScopeHasIssuerError (409 scope-has-issuer): no built-in lock on a scope Issuer signs for.
type ScopeHasIssuerError struct {
	Problem
	Scope, Issuer string
}

// ResetNotBelowError (409 reset-not-below): an admin reset only lowers a fence.
type ResetNotBelowError struct{ Problem }

// BindingConflictError (409 binding-conflict): a rebind contradicting a [[scopes]] binding.
type BindingConflictError struct{ Problem }

// ---- 400 and other refusals of the request itself ---------------------------------------------

// MissingTokenError (428 missing-token): a write without a token.
type MissingTokenError struct{ Problem }

// MalformedTokenError (400 malformed-token).
type MalformedTokenError struct{ Problem }

// InvalidKeyError (400 invalid-key); Column for a table key.
type InvalidKeyError struct {
	Problem
	Column string
}

// InvalidScopeError (400 invalid-scope).
type InvalidScopeError struct{ Problem }

// InvalidJSONError (400 invalid-json).
type InvalidJSONError struct{ Problem }

// InvalidBatchError (400 invalid-batch).
type InvalidBatchError struct{ Problem }

// InvalidRowError (400 invalid-row): Column is unknown or not writable.
type InvalidRowError struct {
	Problem
	Column string
}

// InvalidValueError (422 invalid-value): PostgreSQL refused a value of a table row.
type InvalidValueError struct {
	Problem
	Column, Constraint string
}

// IdempotencyKeyReusedError (422 idempotency-key-reused): the Idempotency-Key was already
// used for another request; nothing was done.
type IdempotencyKeyReusedError struct{ Problem }

// InvalidRequestError (400 invalid-request).
type InvalidRequestError struct{ Problem }

// PayloadTooLargeError (413 payload-too-large).
type PayloadTooLargeError struct{ Problem }

// UnsupportedMediaTypeError (415 unsupported-media-type).
type UnsupportedMediaTypeError struct{ Problem }

// UnsupportedTransferCodingError (501 unsupported-transfer-coding).
type UnsupportedTransferCodingError struct{ Problem }

// MisdirectedRequestError (421 misdirected-request): a Host this server does not answer for.
type MisdirectedRequestError struct{ Problem }

// BodyTimeoutError (408 body-timeout): the request body arrived too slowly.
type BodyTimeoutError struct{ Problem }

// NotFoundError (404 not-found): an absent key, fence, lock, row or resource, or an unknown route.
type NotFoundError struct{ Problem }

// MethodNotAllowedError (405 method-not-allowed).
type MethodNotAllowedError struct{ Problem }

// UnauthenticatedError (401 unauthenticated): no valid credential.
type UnauthenticatedError struct{ Problem }

// ForbiddenError (403 forbidden): the credential lacks Right on Name (a key, scope, lock or
// resource).
type ForbiddenError struct {
	Problem
	Right, Name string
}

// UnavailableError (503 unavailable): the database is unreachable, read-only or overloaded, or
// load was shed. RetryAfter is the server's Retry-After ("" if none). The outcome of a write is
// unknown: retry it with the same token.
type UnavailableError struct {
	Problem
	RetryAfter string
}

// InternalError (500 internal).
type InternalError struct{ Problem }

// UnknownProblemError is an answer whose problem type this version does not know (or a non-2xx
// answer without a problem body). Status tells what kind of refusal it is.
type UnknownProblemError struct{ Problem }

// problemTypes maps each problem type's slug to its error type: every type the server defines
// (its /openapi.json lists them; a test checks this map against it).
var problemTypes = map[string]func(p Problem) error{
	"stale-token": func(p Problem) error {
		e := &StaleTokenError{Problem: p, Presented: p.str("presented_token"), Current: p.str("current_token"),
			Key: p.str("key"), Scope: p.str("scope"), Resource: p.str("resource")}
		if list, ok := p.Body["stale_keys"].([]any); ok {
			for _, it := range list {
				if m, ok := it.(map[string]any); ok {
					q := Problem{Body: m}
					e.StaleKeys = append(e.StaleKeys, StaleKey{Key: q.str("key"), Resource: q.str("resource"), Current: q.str("current_token")})
				}
			}
		}
		return e
	},
	"scope-mismatch": func(p Problem) error {
		return &ScopeMismatchError{Problem: p, Key: p.str("key"), Resource: p.str("resource"), Scope: p.str("scope"), PresentedScope: p.str("presented_scope")}
	},
	"token-not-issued": func(p Problem) error {
		return &TokenNotIssuedError{Problem: p, Scope: p.str("scope"), Key: p.str("key"), Presented: p.str("presented_token"), LatestIssued: p.str("latest_issued")}
	},
	"token-jump": func(p Problem) error {
		return &TokenJumpError{Problem: p, Key: p.str("key"), Scope: p.str("scope"), Resource: p.str("resource"),
			Presented: p.str("presented_token"), Current: p.str("current_token"), MaxJump: p.str("max_jump")}
	},
	"missing-token-proof": func(p Problem) error { return &MissingTokenProofError{p} },
	"invalid-token-proof": func(p Problem) error { return &InvalidTokenProofError{p} },
	"lock-lost": func(p Problem) error {
		return &LockLostError{Problem: p, Holder: p.str("holder"), RemainingMs: p.int64("remaining_ms")}
	},
	"lock-held": func(p Problem) error {
		return &LockHeldError{Problem: p, Holder: p.str("holder"), RemainingMs: p.int64("remaining_ms")}
	},
	"lock-exhausted": func(p Problem) error { return &LockExhaustedError{p} },
	"scope-has-issuer": func(p Problem) error {
		return &ScopeHasIssuerError{Problem: p, Scope: p.str("scope"), Issuer: p.str("issuer")}
	},
	"reset-not-below":  func(p Problem) error { return &ResetNotBelowError{p} },
	"binding-conflict": func(p Problem) error { return &BindingConflictError{p} },
	"missing-token":    func(p Problem) error { return &MissingTokenError{p} },
	"malformed-token":  func(p Problem) error { return &MalformedTokenError{p} },
	"invalid-key":      func(p Problem) error { return &InvalidKeyError{Problem: p, Column: p.str("column")} },
	"invalid-scope":    func(p Problem) error { return &InvalidScopeError{p} },
	"invalid-json":     func(p Problem) error { return &InvalidJSONError{p} },
	"invalid-batch":    func(p Problem) error { return &InvalidBatchError{p} },
	"invalid-row":      func(p Problem) error { return &InvalidRowError{Problem: p, Column: p.str("column")} },
	"invalid-value": func(p Problem) error {
		return &InvalidValueError{Problem: p, Column: p.str("column"), Constraint: p.str("constraint")}
	},
	"invalid-request":             func(p Problem) error { return &InvalidRequestError{p} },
	"idempotency-key-reused":      func(p Problem) error { return &IdempotencyKeyReusedError{p} },
	"payload-too-large":           func(p Problem) error { return &PayloadTooLargeError{p} },
	"unsupported-media-type":      func(p Problem) error { return &UnsupportedMediaTypeError{p} },
	"unsupported-transfer-coding": func(p Problem) error { return &UnsupportedTransferCodingError{p} },
	"misdirected-request":         func(p Problem) error { return &MisdirectedRequestError{p} },
	"body-timeout":                func(p Problem) error { return &BodyTimeoutError{p} },
	"not-found":                   func(p Problem) error { return &NotFoundError{p} },
	"method-not-allowed":          func(p Problem) error { return &MethodNotAllowedError{p} },
	"unauthenticated":             func(p Problem) error { return &UnauthenticatedError{p} },
	"forbidden": func(p Problem) error {
		name := ""
		for _, f := range []string{"key", "scope", "lock", "resource"} {
			if name = p.str(f); name != "" {
				break
			}
		}
		return &ForbiddenError{Problem: p, Right: p.str("right"), Name: name}
	},
	"unavailable": func(p Problem) error { return &UnavailableError{Problem: p, RetryAfter: p.Header.Get("Retry-After")} },
	"internal":    func(p Problem) error { return &InternalError{p} },
}

// ProblemSlugs lists the problem types this version maps to an error type of its own.
func ProblemSlugs() []string {
	out := make([]string, 0, len(problemTypes))
	for s := range problemTypes {
		out = append(out, s)
	}
	return out
}

// ParseProblem turns a non-2xx answer (its status, headers and body) into its typed error:
// the error type of its problem type, else *UnknownProblemError.
func ParseProblem(status int, header http.Header, body []byte) error {
	p := Problem{Status: status, Header: header, Body: map[string]any{}}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.UseNumber()
	var m map[string]any
	if dec.Decode(&m) == nil && m != nil {
		p.Body = m
		p.Type = p.str("type")
		p.Title = p.str("title")
		p.Detail = p.str("detail")
	} else if len(body) > 0 {
		d := string(body)
		if len(d) > 500 {
			d = d[:500]
		}
		p.Detail = d
	}
	if p.Type != "" {
		p.Slug = p.Type[strings.LastIndex(p.Type, "/")+1:]
	}
	if p.Header == nil {
		p.Header = http.Header{}
	}
	if mk, ok := problemTypes[p.Slug]; ok && strings.HasPrefix(p.Type, ProblemBase) {
		return mk(p)
	}
	return &UnknownProblemError{p}
}

// ---- errors raised without an answer ------------------------------------------------------------

// LeaseLostError is returned, without sending anything, by a write through a lease that is
// known to be lost: a renew was refused, its expiry passed without a successful renew, or a
// write under it was refused as stale. Cause (also via errors.Unwrap) is what lost it, if any.
type LeaseLostError struct {
	Name, Token string
	Reason      string
	Cause       error
}

func (e *LeaseLostError) Error() string {
	s := fmt.Sprintf("fencegate: lease %q (token %s) is lost: %s", e.Name, e.Token, e.Reason)
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

func (e *LeaseLostError) Unwrap() error { return e.Cause }

// TransportError: no answer (the connection failed or timed out, or a redirect was refused).
// The outcome of a write is unknown; retrying it with the same token is safe.
type TransportError struct {
	Method, URL string
	Err         error
}

func (e *TransportError) Error() string {
	return fmt.Sprintf("fencegate: %s %s: %v", e.Method, e.URL, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// ErrCrossOriginRedirect is the cause of a TransportError when the server redirected to another
// origin: the client never sends a token, a scope, a credential or a body there.
var ErrCrossOriginRedirect = errors.New("refused a redirect to another origin")

// IsFencing reports whether err says "this writer must stop": a stale token, a scope mismatch,
// a token not issued, a token jump, a missing or invalid proof, a lost lock or a lost lease.
func IsFencing(err error) bool {
	var (
		a *StaleTokenError
		b *ScopeMismatchError
		c *TokenNotIssuedError
		d *TokenJumpError
		e *MissingTokenProofError
		f *InvalidTokenProofError
		g *LockLostError
		h *LeaseLostError
	)
	return errors.As(err, &a) || errors.As(err, &b) || errors.As(err, &c) || errors.As(err, &d) ||
		errors.As(err, &e) || errors.As(err, &f) || errors.As(err, &g) || errors.As(err, &h)
}
