package apicheck

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/han-app/gateway/docs"
)

// Checker validates answers against the description.
type Checker struct {
	doc    *openapi3.T
	router routers.Router

	mu       sync.Mutex // guards failures, checked, valid
	failures []string
	checked  int
	// valid holds the answerKey of answers already found valid: the
	// validator compiles its schemas on every call, and the suites receive
	// the same answer (an error code, a 429) many times.
	valid map[[sha256.Size]byte]struct{}
}

// answerKey identifies an answer by everything its validation reads: the
// operation, status, Content-Type, the values of the headers the
// description declares for it, and the body.
func answerKey(method string, route *routers.Route, resp *http.Response, body []byte) [sha256.Size]byte {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s %d %q\n", method, route.Path, resp.StatusCode, resp.Header.Values("Content-Type"))
	if r := route.Operation.Responses.Status(resp.StatusCode); r != nil && r.Value != nil {
		names := make([]string, 0, len(r.Value.Headers))
		for name := range r.Value.Headers {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			fmt.Fprintf(h, "%s: %q\n", name, resp.Header.Values(name))
		}
	}
	h.Write(body)
	var k [sha256.Size]byte
	h.Sum(k[:0])
	return k
}

// Load parses and validates docs/openapi.yaml (OpenAPI 3.1: its schemas
// are JSON Schema 2020-12).
func Load() (*Checker, error) {
	doc, err := openapi3.NewLoader().LoadFromData(docs.OpenAPIYAML)
	if err != nil {
		return nil, fmt.Errorf("apicheck: load openapi.yaml: %w", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		return nil, errors.New("apicheck: openapi.yaml is not OpenAPI 3.1")
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("apicheck: openapi.yaml is invalid: %w", err)
	}
	r, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("apicheck: %w", err)
	}
	return &Checker{doc: doc, router: r, valid: map[[sha256.Size]byte]struct{}{}}, nil
}

// Doc is the loaded description.
func (c *Checker) Doc() *openapi3.T { return c.doc }

var (
	installed *Checker
	once      sync.Once
)

// Install makes http.DefaultTransport validate every answer it carries and
// returns the checker (the same one on every call).
func Install() (*Checker, error) {
	var err error
	once.Do(func() {
		var c *Checker
		if c, err = Load(); err == nil {
			installed = c
			http.DefaultTransport = c.Transport(http.DefaultTransport)
		}
	})
	if err == nil && installed == nil {
		err = errors.New("apicheck: an earlier Install failed")
	}
	return installed, err
}

// Err lists every answer that did not match the description (nil: none).
func (c *Checker) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.failures) == 0 {
		return nil
	}
	return fmt.Errorf("apicheck: %d of %d answers do not match docs/openapi.yaml:\n%s",
		len(c.failures), c.checked, strings.Join(c.failures, "\n"))
}

// Transport wraps base: an answer that does not match the description is
// recorded for Err and returned to the caller as an error, so the test that
// made the request fails at that request.
func (c *Checker) Transport(base http.RoundTripper) http.RoundTripper {
	return roundTripper{c: c, base: base}
}

// netHTTPOwn are the statuses net/http answers itself, in plain text, to a
// request it could not parse (docs/errors.md): they reach no route.
var netHTTPOwn = map[int]bool{
	http.StatusExpectationFailed:           true,
	http.StatusRequestHeaderFieldsTooLarge: true,
	http.StatusNotImplemented:              true,
	http.StatusHTTPVersionNotSupported:     true,
}

type roundTripper struct {
	c    *Checker
	base http.RoundTripper
}

func (rt roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.base.RoundTrip(req)
	if err != nil || resp.StatusCode == http.StatusSwitchingProtocols || req.Header.Get("Upgrade") != "" {
		return resp, err
	}
	if netHTTPOwn[resp.StatusCode] {
		return resp, nil
	}
	route, params, ferr := rt.c.router.FindRoute(req)
	if ferr != nil {
		return resp, nil // not a documented operation (unknown path or method)
	}
	body, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = &replay{r: bytes.NewReader(body), err: rerr}
	if rerr != nil {
		return resp, nil // a broken answer is the test's to judge
	}
	key := answerKey(req.Method, route, resp, body)
	rt.c.mu.Lock()
	rt.c.checked++
	_, known := rt.c.valid[key]
	rt.c.mu.Unlock()
	if known {
		return resp, nil
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true},
	}
	in.SetBodyBytes(body)
	verr := openapi3filter.ValidateResponse(req.Context(), in)
	rt.c.mu.Lock()
	if verr == nil {
		rt.c.valid[key] = struct{}{}
	}
	if verr != nil {
		rt.c.failures = append(rt.c.failures, fmt.Sprintf("%s %s → %d %.300s: %v", req.Method, route.Path, resp.StatusCode, body, verr))
	}
	rt.c.mu.Unlock()
	if verr != nil {
		return nil, fmt.Errorf("apicheck: %s %s → %d does not match docs/openapi.yaml: %w", req.Method, route.Path, resp.StatusCode, verr)
	}
	return resp, nil
}

// replay gives back a body already read, then the error that ended the
// read.
type replay struct {
	r   *bytes.Reader
	err error
}

func (b *replay) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF && b.err != nil {
		err = b.err
	}
	return n, err
}

func (b *replay) Close() error { return nil }
