package loadtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
)

// API calls the gateway's REST endpoints (chat and project Redis API) and records
// http_reqs, http_req_duration (overall and per endpoint, named by method
// and route template), http_req_failed and errors{status,code}. Safe for
// concurrent use.
type API struct {
	base   string
	client *http.Client
	reg    *Registry
	reqs   *Counter
	dur    *Trend
	failed *Rate
	errs   *errorCounter
	// target is the per-target tag value and targetReqs its request count
	// (CountPerTarget); empty and nil: none.
	target     string
	targetReqs *Counter

	mu        sync.Mutex        // guards endpoints
	endpoints map[string]*Trend // "METHOD template" → per-endpoint trend
}

// NewAPI returns a client for base (http://127.0.0.1:8080), which must be
// loopback.
func NewAPI(base string, client *http.Client, reg *Registry) (*API, error) {
	u, err := CheckLoopbackURL(base)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("loadtest: target %q must be an http(s) URL", base)
	}
	return &API{
		base: u.Scheme + "://" + u.Host, client: client, reg: reg,
		reqs: reg.Counter(MetricHTTPReqs), dur: reg.Trend(MetricHTTPReqDuration),
		failed: reg.Rate(MetricHTTPReqFailed), errs: newErrorCounter(reg), endpoints: map[string]*Trend{},
	}, nil
}

// CountPerTarget makes the client also count its requests and errors
// tagged target=<base> (http_reqs{target=…}, errors{target=…}), for runs
// spread over several gateways. Call it before the first request.
func (a *API) CountPerTarget() {
	a.target, a.targetReqs = a.base, a.reg.Counter(Tagged(MetricHTTPReqs, MetricTargetTag, a.base))
}

// Close drops the client's idle keep-alive connections.
func (a *API) Close() { a.client.CloseIdleConnections() }

// Base is the target's base URL.
func (a *API) Base() string { return a.base }

// WSURL is the realtime endpoint's ws:// URL with an optional ticket.
func (a *API) WSURL(ticket string) string {
	u := "ws" + a.base[len("http"):] + RealtimePath
	if ticket != "" {
		u += "?ticket=" + url.QueryEscape(ticket)
	}
	return u
}

// APIError is a response with an unexpected status.
type APIError struct {
	Status     int
	Code       string        // the body's {"error":"<code>"}, if any
	RetryAfter time.Duration // from Retry-After, if any
}

func (e *APIError) Error() string {
	return fmt.Sprintf("HTTP %d %s", e.Status, e.Code)
}

// Request is one REST call.
type Request struct {
	Method   string
	Template string // route template naming the endpoint, e.g. /v1/dialogs/{id}/messages
	Path     string // actual path; empty means Template
	Token    string
	Header   map[string]string
	Body     any // JSON-encoded when non-nil
	Out      any // decoded from a success body when non-nil
	// OK lists the expected statuses; empty means any 2xx.
	OK []int
	// Expected, when it holds the status, makes a non-OK answer count as
	// neither failed nor error (the rate-limit scenario expects 429s).
	Expected []int
	// OnResponse, when set, sees every answer's status and headers.
	OnResponse func(status int, h http.Header)
}

func (a *API) endpointTrend(name string) *Trend {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.endpoints[name]
	if !ok {
		t = a.reg.Trend(Tagged(MetricHTTPReqDuration, "endpoint", name))
		a.endpoints[name] = t
	}
	return t
}

// Do sends the request. It returns the status, and an *APIError for a
// status outside OK.
func (a *API) Do(ctx context.Context, r Request) (int, error) {
	path := r.Path
	if path == "" {
		path = r.Template
	}
	var body io.Reader
	if r.Body != nil {
		b, err := json.Marshal(r.Body)
		if err != nil {
			return 0, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, a.base+path, body)
	if err != nil {
		return 0, err
	}
	if r.Body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.Token != "" {
		req.Header.Set("Authorization", "Bearer "+r.Token)
	}
	for k, v := range r.Header {
		req.Header.Set(k, v)
	}
	endpoint := r.Method + " " + r.Template
	t0 := time.Now()
	resp, err := a.client.Do(req)
	if a.targetReqs != nil {
		a.targetReqs.Inc()
	}
	if err != nil {
		a.reqs.Inc()
		a.failed.Add(true)
		a.errs.addFor(a.target, 0, "transport")
		return 0, fmt.Errorf("%s: %w", endpoint, err)
	}
	data, rerr := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	resp.Body.Close()
	el := time.Since(t0)
	if r.OnResponse != nil {
		r.OnResponse(resp.StatusCode, resp.Header)
	}
	a.reqs.Inc()
	a.dur.Add(el)
	a.endpointTrend(endpoint).Add(el)
	ok := statusIn(resp.StatusCode, r.OK) || len(r.OK) == 0 && resp.StatusCode/100 == 2
	if ok && rerr == nil {
		a.failed.Add(false)
		if r.Out != nil && len(data) > 0 {
			if err := json.Unmarshal(data, r.Out); err != nil {
				a.errs.addFor(a.target, resp.StatusCode, "bad_body")
				return resp.StatusCode, fmt.Errorf("%s: decode: %w", endpoint, err)
			}
		}
		return resp.StatusCode, nil
	}
	ae := &APIError{Status: resp.StatusCode}
	var eb struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(data, &eb) == nil {
		ae.Code = eb.Error
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && ra >= 0 {
		ae.RetryAfter = time.Duration(ra) * time.Second
	}
	expected := statusIn(resp.StatusCode, r.Expected)
	a.failed.Add(!expected)
	if !expected {
		code := ae.Code
		if code == "" {
			code = "http"
		}
		a.errs.addFor(a.target, resp.StatusCode, code)
	}
	return resp.StatusCode, ae
}

// DoRetry is Do that waits out a refusal the server asks to retry — 429, or
// 503 with Retry-After (an overloaded database or Redis: nothing was
// written) — for Retry-After (at least 100 ms; at most maxWait in total)
// and retries; for setup calls, not for measured traffic.
func (a *API) DoRetry(ctx context.Context, r Request, maxWait time.Duration) (int, error) {
	deadline := time.Now().Add(maxWait)
	for {
		st, err := a.Do(ctx, r)
		var ae *APIError
		if !errors.As(err, &ae) || !retryable(ae) {
			return st, err
		}
		wait := max(ae.RetryAfter, 100*time.Millisecond)
		if time.Now().Add(wait).After(deadline) {
			return st, err
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// retryable reports whether a refusal asks the client to come back: a 429,
// or a 503 that names when (a 503 without Retry-After is an outage, not a
// busy moment).
func retryable(ae *APIError) bool {
	return ae.Status == http.StatusTooManyRequests ||
		(ae.Status == http.StatusServiceUnavailable && ae.RetryAfter > 0)
}

func statusIn(s int, list []int) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// User is a load-test identity: a fresh UUID and a dev HS256 token.
type User struct {
	ID    string
	Token string
}

// MintUsers creates n users with dev tokens signed by secret (the
// gateway's HAN_JWT_DEV_HS256_SECRET), valid for ttl.
func MintUsers(secret []byte, n int, ttl time.Duration) ([]User, error) {
	out := make([]User, n)
	for i := range out {
		id := ids.New()
		tok, err := auth.MintDevToken(secret, auth.DevClaims{Subject: id, TTL: ttl})
		if err != nil {
			return nil, err
		}
		out[i] = User{ID: id, Token: tok}
	}
	return out, nil
}

// Dialog and Message are the DTOs the scenarios read (docs/api.md).
type Dialog struct {
	ID        string   `json:"id"`
	MemberIDs []string `json:"memberIds"`
	LastSeq   int64    `json:"lastSeq"`
}

// Message is the message DTO.
type Message struct {
	ID       string `json:"id"`
	DialogID string `json:"dialogId"`
	Seq      int64  `json:"seq"`
	Body     string `json:"body"`
}

// Me calls GET /v1/me, which also records the user on first sight (dialog
// members must be known users).
func (a *API) Me(ctx context.Context, u User) error {
	_, err := a.DoRetry(ctx, Request{Method: http.MethodGet, Template: "/v1/me", Token: u.Token}, time.Minute)
	return err
}

// CreateDialog calls POST /v1/dialogs as creator with the other members.
func (a *API) CreateDialog(ctx context.Context, creator User, memberIDs []string) (Dialog, error) {
	var d Dialog
	_, err := a.DoRetry(ctx, Request{Method: http.MethodPost, Template: "/v1/dialogs", Token: creator.Token,
		Body: map[string]any{"memberIds": memberIDs, "title": "loadtest"}, Out: &d, OK: []int{http.StatusCreated}}, time.Minute)
	return d, err
}

// SendMessage calls POST /v1/dialogs/{id}/messages with an Idempotency-Key.
func (a *API) SendMessage(ctx context.Context, sender User, dialogID, body, idemKey string) (Message, error) {
	var m Message
	_, err := a.Do(ctx, Request{Method: http.MethodPost, Template: "/v1/dialogs/{id}/messages",
		Path: "/v1/dialogs/" + dialogID + "/messages", Token: sender.Token,
		Header: map[string]string{"Idempotency-Key": idemKey},
		Body:   map[string]any{"body": body}, Out: &m, OK: []int{http.StatusCreated}})
	return m, err
}

// History calls GET /v1/dialogs/{id}/messages?afterSeq=&limit=.
func (a *API) History(ctx context.Context, u User, dialogID string, afterSeq int64, limit int) ([]Message, *string, error) {
	var page struct {
		Items      []Message `json:"items"`
		NextCursor *string   `json:"nextCursor"`
	}
	_, err := a.Do(ctx, Request{Method: http.MethodGet, Template: "/v1/dialogs/{id}/messages",
		Path:  "/v1/dialogs/" + dialogID + "/messages?afterSeq=" + strconv.FormatInt(afterSeq, 10) + "&limit=" + strconv.Itoa(limit),
		Token: u.Token, Out: &page, OK: []int{http.StatusOK}})
	return page.Items, page.NextCursor, err
}

// Ticket calls POST /v1/realtime/tickets and returns the one-time ticket.
func (a *API) Ticket(ctx context.Context, u User) (string, error) {
	var t struct {
		Ticket string `json:"ticket"`
	}
	_, err := a.DoRetry(ctx, Request{Method: http.MethodPost, Template: "/v1/realtime/tickets", Token: u.Token,
		Out: &t, OK: []int{http.StatusOK, http.StatusCreated}}, 30*time.Second)
	if err == nil && t.Ticket == "" {
		err = errors.New("ticket: empty")
	}
	return t.Ticket, err
}
