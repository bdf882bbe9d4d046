package auth_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/testenv"
)

// redirectingIdP is an https JWKS endpoint that serves the usual keys at /
// until to is set, then redirects there.
type redirectingIdP struct {
	*httptest.Server
	to atomic.Pointer[string]
}

func newRedirectingIdP(t *testing.T) *redirectingIdP {
	t.Helper()
	idp := &redirectingIdP{}
	idp.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if to := idp.to.Load(); to != nil && r.URL.Path == "/" {
			http.Redirect(w, r, *to, http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		if r.URL.Path == "/moved" {
			_, _ = w.Write(jwksDoc(append(baseJWKs(), rsaJWK("moved", keys().rsaOther))...))
			return
		}
		_, _ = w.Write(jwksDoc(baseJWKs()...))
	}))
	t.Cleanup(idp.Close)
	return idp
}

// An https JWKS URL that redirects to plain http must not let whoever
// answers the http request choose the keys: the fetch fails, the keys
// loaded before stay, and no plain-http request is even sent, whatever
// redirect policy the caller's HTTPClient has.
func TestJWKSRedirectFromHTTPSToHTTPIsRefused(t *testing.T) {
	k := keys()
	for name, permissive := range map[string]bool{
		"caller's client with the default redirect policy": false,
		"caller's client that follows every redirect":      true,
	} {
		t.Run(name, func(t *testing.T) {
			attacker := newJWKSServer(t, rsaJWK("evil", k.rsaOther)) // plain http
			idp := newRedirectingIdP(t)
			client := idp.Client()
			if permissive {
				client.CheckRedirect = func(*http.Request, []*http.Request) error { return nil }
			}
			clock := newTestClock()
			v := newVerifier(t, auth.Config{Env: "prod", JWKSURL: idp.URL, HTTPClient: client, Now: clock.Now}, nil)
			now := clock.Now()
			mustAccept(t, v, sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now)))

			to := attacker.URL + "/jwks.json"
			idp.to.Store(&to)
			mustReject(t, v, sign(t, jwt.SigningMethodRS256, k.rsaOther, "evil", claimsAt(now)), "unknown key id")
			if n := attacker.hits.Load(); n != 0 {
				t.Fatalf("the https JWKS URL's redirect to http was followed (%d plain-http requests)", n)
			}
			// The refused fetch kept the previous keys.
			mustAccept(t, v, sign(t, jwt.SigningMethodES256, k.ec, kidEC, claimsAt(now)))
		})
	}
	t.Run("startup fails when the https JWKS URL redirects to http", func(t *testing.T) {
		attacker := newJWKSServer(t, baseJWKs()...)
		idp := newRedirectingIdP(t)
		to := attacker.URL
		idp.to.Store(&to)
		v, err := auth.NewVerifier(context.Background(), auth.Config{Env: "prod", JWKSURL: idp.URL, HTTPClient: idp.Client()}, nil)
		if err == nil {
			v.Close()
			t.Fatal("NewVerifier loaded a JWKS from plain http behind its https URL")
		}
		if n := attacker.hits.Load(); n != 0 {
			t.Fatalf("%d plain-http requests at startup", n)
		}
	})
	t.Run("a redirect to another https URL is followed", func(t *testing.T) {
		idp := newRedirectingIdP(t)
		clock := newTestClock()
		v := newVerifier(t, auth.Config{Env: "prod", JWKSURL: idp.URL, HTTPClient: idp.Client(), Now: clock.Now}, nil)
		to := idp.URL + "/moved"
		idp.to.Store(&to)
		mustAccept(t, v, sign(t, jwt.SigningMethodRS256, k.rsaOther, "moved", claimsAt(clock.Now())))
	})
}

// The request whose unknown kid starts the JWKS refetch gets its answer by
// its own deadline even while the JWKS endpoint stalls; the refetch goes on
// without it, and a later request for the same kid shares it rather than
// fetching again, and is accepted once the new key arrives.
func TestUnknownKIDMissReturnsByTheCallersDeadline(t *testing.T) {
	k := keys()
	srv := newJWKSServer(t, baseJWKs()...)
	clock := newTestClock()
	v := newVerifier(t, auth.Config{JWKSURL: srv.URL, HTTPClient: srv.Client(), Now: clock.Now}, nil)
	rotated := randomKID("stalled")
	srv.set(append(baseJWKs(), rsaJWK(rotated, k.rsaOther))...)
	srv.delay.Store(int64(time.Second)) // the JWKS endpoint now stalls
	token := sign(t, jwt.SigningMethodRS256, k.rsaOther, rotated, claimsAt(clock.Now()))
	before := srv.hits.Load()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := v.Verify(ctx, token); err == nil {
		t.Fatal("accepted before the stalled refetch returned")
	}
	if took := time.Since(start); took > 600*time.Millisecond {
		t.Fatalf("Verify with a 100ms deadline returned after %v", took.Round(10*time.Millisecond))
	}

	mustAccept(t, v, token) // waits for the refetch the first request started
	if got := srv.hits.Load() - before; got != 1 {
		t.Fatalf("JWKS fetches = %d, want 1 (the second request shares the first one's)", got)
	}
}

// Close ends a refetch stalled on the JWKS endpoint at once (the keys
// stay as they were and keep verifying), and afterwards an unknown kid is
// rejected without a fetch. The package's leak check proves no goroutine
// outlives it.
func TestCloseEndsAStalledJWKSRefetch(t *testing.T) {
	k := keys()
	srv := newJWKSServer(t, baseJWKs()...)
	clock := newTestClock()
	v, err := auth.NewVerifier(context.Background(), auth.Config{JWKSURL: srv.URL, HTTPClient: srv.Client(), Now: clock.Now}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.delay.Store(int64(2 * time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _ = v.Verify(ctx, floodToken(t, clock.Now())) // leaves its refetch running
	testenv.Eventually(t, 5*time.Second, func() bool { return srv.hits.Load() == 2 }, "the refetch never reached the JWKS endpoint")

	start := time.Now()
	v.Close()
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Close waited %v for a stalled refetch", took.Round(10*time.Millisecond))
	}
	v.Close() // idempotent
	mustAccept(t, v, sign(t, jwt.SigningMethodES256, k.ec, kidEC, claimsAt(clock.Now())))
	clock.Advance(time.Minute)
	hits := srv.hits.Load()
	mustReject(t, v, floodToken(t, clock.Now()), "unknown key id")
	if got := srv.hits.Load(); got != hits {
		t.Fatalf("a closed Verifier fetched the JWKS %d times", got-hits)
	}
}
