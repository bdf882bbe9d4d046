package restapi_test

import (
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// statusNames are the net/http status constants the error values use, by
// name (the source is read as text).
var statusNames = map[string]int{
	"http.StatusBadRequest": http.StatusBadRequest, "http.StatusUnauthorized": http.StatusUnauthorized,
	"http.StatusForbidden": http.StatusForbidden, "http.StatusNotFound": http.StatusNotFound,
	"http.StatusMethodNotAllowed": http.StatusMethodNotAllowed, "http.StatusRequestTimeout": http.StatusRequestTimeout,
	"http.StatusConflict": http.StatusConflict, "http.StatusPreconditionFailed": http.StatusPreconditionFailed,
	"http.StatusRequestEntityTooLarge":        http.StatusRequestEntityTooLarge,
	"http.StatusUnsupportedMediaType":         http.StatusUnsupportedMediaType,
	"http.StatusRequestedRangeNotSatisfiable": http.StatusRequestedRangeNotSatisfiable,
	"http.StatusTooManyRequests":              http.StatusTooManyRequests, "http.StatusInternalServerError": http.StatusInternalServerError,
	"http.StatusServiceUnavailable": http.StatusServiceUnavailable, "http.StatusInsufficientStorage": http.StatusInsufficientStorage,
}

// Codes on one side only, each with the reason.
var (
	// answered by internal/connlimit before a request is read
	docsOnly = map[string]bool{"overloaded": true}
	// 499: the client went away, so nobody reads the answer (it is counted
	// in the metrics only)
	codeOnly = map[string]bool{"client_closed_request": true}
)

// Every error code the REST API's source makes (apiErr, apierr.New,
// apierr.NewRetry with a literal status and code) is listed in
// docs/errors.md with that status, and every code listed there is made
// somewhere: a new code, or a code moved to another status, fails here
// until the reference says so.
func TestErrorCodesAreDocumented(t *testing.T) {
	made := map[string][]int{}
	call := regexp.MustCompile(`\b(?:apiErr|New|NewRetry)\((http\.Status[A-Za-z]+|[0-9]{3}), "([a-z0-9_]+)"`)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			st, ok := statusNames[m[1]]
			if !ok {
				if st, err = strconv.Atoi(m[1]); err != nil {
					t.Fatalf("%s: status %s: add it to statusNames", path, m[1])
				}
			}
			if !slices.Contains(made[m[2]], st) {
				made[m[2]] = append(made[m[2]], st)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../docs/errors.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string][]int{}
	for _, m := range regexp.MustCompile("(?m)^\\| ([0-9]{3}) \\| `([a-z0-9_]+)` \\|").FindAllStringSubmatch(string(raw), -1) {
		st, _ := strconv.Atoi(m[1])
		if !slices.Contains(documented[m[2]], st) {
			documented[m[2]] = append(documented[m[2]], st)
		}
	}
	if len(made) < 40 || len(documented) < 40 {
		t.Fatalf("read %d codes from the source and %d from docs/errors.md: one of them changed shape", len(made), len(documented))
	}
	for code, statuses := range made {
		for _, st := range statuses {
			if !codeOnly[code] && !slices.Contains(documented[code], st) {
				t.Errorf("%d %s is answered but docs/errors.md does not list it (it lists %v)", st, code, documented[code])
			}
		}
	}
	for code, statuses := range documented {
		for _, st := range statuses {
			if !docsOnly[code] && !slices.Contains(made[code], st) {
				t.Errorf("docs/errors.md lists %d %s, which the source never makes (it makes %v)", st, code, made[code])
			}
		}
	}
}

// The browser client shows every code with a sentence of its own
// (web/static/js/errors.js): each code in docs/errors.md, REST and
// WebSocket error frames alike, has one, and the client lists no code that
// neither the reference nor the client itself makes.
func TestWebClientHasASentenceForEveryCode(t *testing.T) {
	js, err := os.ReadFile("../web/static/js/errors.js")
	if err != nil {
		t.Fatal(err)
	}
	sentences := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z0-9_]+): "`).FindAllStringSubmatch(string(js), -1) {
		sentences[m[1]] = true
	}
	raw, err := os.ReadFile("../docs/errors.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| (?:[0-9]{3} \\| )?`([a-z0-9_]+)` \\|").FindAllStringSubmatch(string(raw), -1) {
		documented[m[1]] = true
	}
	if len(documented) < 50 || len(sentences) < 50 {
		t.Fatalf("read %d documented codes and %d sentences: the tables' format changed", len(documented), len(sentences))
	}
	// made by the client itself: no answer, an answer it cannot read, a
	// token pasted for another user
	clientOnly := map[string]bool{"network_error": true, "invalid_response": true, "token_user_mismatch": true}
	for code := range documented {
		if !sentences[code] {
			t.Errorf("docs/errors.md lists %s, web/static/js/errors.js has no sentence for it", code)
		}
	}
	for code := range sentences {
		if !documented[code] && !clientOnly[code] {
			t.Errorf("web/static/js/errors.js has a sentence for %s, which docs/errors.md does not list", code)
		}
	}
}
