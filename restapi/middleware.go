package restapi

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"github.com/han-app/gateway/internal/auth"
)

type ctxKey int

const (
	ctxRequestID ctxKey = iota
)

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxRequestID).(string)
	return id
}

// statusWriter records the status and size for the access log and metrics.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += n
	return n, err
}

// RecordStatus records a status the handler sends past this writer (the
// WebSocket upgrade writes its 101 on the hijacked connection itself).
func (w *statusWriter) RecordStatus(code int) {
	if w.status == 0 {
		w.status = code
	}
}

// Unwrap lets http.ResponseController (and the WebSocket upgrade) reach the
// underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func validRequestID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// observe is the outermost middleware: request id, panic recovery, access
// log (no tokens, bodies or raw client IPs) and HTTP metrics.
func (s *Server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := r.Header.Get("X-Request-Id")
		if !validRequestID(id) {
			id = newRequestID()
		}
		w.Header().Set("X-Request-Id", id)
		ctx := context.WithValue(r.Context(), ctxRequestID, id)
		sw := &statusWriter{ResponseWriter: w}
		route := "other"
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.logger.LogAttrs(ctx, slog.LevelError, "panic in handler", slog.String("request_id", id), slog.String("route", route))
				if sw.status == 0 {
					writeError(sw, errInternal)
				}
			}
			if rt, ok := ctx.Value(ctxRouteHolder).(*string); ok && *rt != "" {
				route = *rt
			}
			status := sw.status
			if status == 0 {
				status = http.StatusOK
			}
			d := time.Since(start)
			method := methodLabel(r.Method)
			s.metrics.httpRequests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
			s.metrics.httpDuration.WithLabelValues(route).Observe(d.Seconds())
			if route == "/metrics" || route == "/healthz" || route == "/readyz" || !s.logger.Enabled(ctx, slog.LevelInfo) {
				return // (the IP HMAC is computed only for a line that is written)
			}
			s.logger.LogAttrs(ctx, slog.LevelInfo, "http",
				slog.String("request_id", id), slog.String("method", method), slog.String("route", route),
				slog.Int("status", status), slog.Int("bytes", sw.bytes),
				slog.Float64("duration_ms", float64(d.Microseconds())/1000),
				slog.String("ip_hmac", s.ipHMAC(r)))
		}()
		holder := new(string)
		ctx = context.WithValue(ctx, ctxRouteHolder, holder)
		next.ServeHTTP(sw, r.WithContext(ctx))
	})
}

const ctxRouteHolder ctxKey = 100

// methodLabel is the method as the metrics and the access log name it: a
// standard method by its name, anything else "other". net/http accepts any
// token as a method (up to the 64 KiB header limit) and it reaches observe
// without a token, so the raw text would let any client add metric series
// and long log fields without bound. The label is the constant, not the
// request's string, which shares memory with the whole request line.
func methodLabel(m string) string {
	if l, ok := standardMethods[m]; ok {
		return l
	}
	return "other"
}

var standardMethods = map[string]string{
	http.MethodGet: http.MethodGet, http.MethodHead: http.MethodHead, http.MethodPost: http.MethodPost,
	http.MethodPut: http.MethodPut, http.MethodPatch: http.MethodPatch, http.MethodDelete: http.MethodDelete,
	http.MethodOptions: http.MethodOptions, http.MethodConnect: http.MethodConnect, http.MethodTrace: http.MethodTrace,
}

// routeName is mux middleware (runs after matching): it records the route
// template so the log and metrics label by template, never by raw path.
func routeName(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cur := mux.CurrentRoute(r); cur != nil {
			if tpl, err := cur.GetPathTemplate(); err == nil {
				if h, ok := r.Context().Value(ctxRouteHolder).(*string); ok {
					*h = tpl
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// RouteTemplate returns the matched route template of r ("other" if none):
// the bounded label that rate limiting and metrics use.
func RouteTemplate(r *http.Request) string {
	if cur := mux.CurrentRoute(r); cur != nil {
		if tpl, err := cur.GetPathTemplate(); err == nil {
			return tpl
		}
	}
	return "other"
}

// ipHMAC returns a short HMAC of the client address, the only form in which
// an IP reaches a log line or a Redis key. An IPv6 client is its /64: a
// network hands each of its hosts at least that much and a host may rotate
// addresses inside it, so one address per bucket would let it pass every
// per-IP limit; IPv4 is the address.
func (s *Server) ipHMAC(r *http.Request) string {
	host := r.RemoteAddr
	if a := s.ClientAddr(r); a.IsValid() {
		host = clientNet(a)
	}
	return HMACHex(s.hmacSecret, host)[:16]
}

// clientNet is the address an IPv4 client is counted as, or the /64 of an
// IPv6 one (clientSubject, spelled as before: an IPv4 address without its
// /32, so the keys of existing windows keep their names).
func clientNet(a netip.Addr) string {
	if a.Is4() {
		return a.String()
	}
	return clientSubject(a).String()
}

// HMACHex is hex(HMAC-SHA256(secret, v)).
func HMACHex(secret []byte, v string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(v))
	return hex.EncodeToString(m.Sum(nil))
}

// authenticate verifies the bearer token (a missing or refused one is 401,
// and past its address's budget of those 429: verifyCredential); userOnly
// refuses service tokens with 403 user_session_required. Users are
// recorded on first sight.
//
// Every answer of an authenticated route carries Cache-Control: no-store:
// it is one caller's data (messages, dialogs, project values), which no
// shared cache and no browser disk cache may keep.
func (s *Server) authenticate(userOnly bool) mux.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "no-store")
			p, ok := s.verifyCredential(w, r) // authfail.go
			if !ok {
				return
			}
			if userOnly && p.Kind != auth.KindUser {
				writeError(w, errUserSessionRequired)
				return
			}
			if !userOnly && p.Kind != auth.KindService {
				writeError(w, errForbidden)
				return
			}
			if p.Kind == auth.KindUser {
				if err := s.seenUser(r.Context(), p.UserID); err != nil {
					s.fail(w, r, err)
					return
				}
			}
			next.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
		})
	}
}

// seenUser records a user on first sight (the store keeps the ids it
// recorded, so a known user costs no write).
func (s *Server) seenUser(ctx context.Context, id string) error {
	return s.store.EnsureUser(ctx, id)
}

func principal(r *http.Request) auth.Principal {
	p, _ := auth.PrincipalFrom(r.Context())
	return p
}
