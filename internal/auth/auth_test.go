package auth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{Redis: true}, &env) }

const (
	testIssuer   = "https://idp.han.test"
	testAudience = "han-api"
	kidRSA       = "rsa-1"
	kidEC        = "ec-1"
	kidEd        = "ed-1"
	testSubject  = "7A1C7E4B-2F3D-4C5E-8A9B-0C1D2E3F4A5B" // upper case on purpose
	wantUserID   = "7a1c7e4b-2f3d-4c5e-8a9b-0c1d2e3f4a5b"
)

var devSecret = []byte("dev-secret-dev-secret-dev-secret-0123")

type testKeys struct {
	rsa, rsaOther *rsa.PrivateKey
	ec            *ecdsa.PrivateKey
	ed            ed25519.PrivateKey
}

var keys = sync.OnceValue(func() testKeys {
	gen := func() *rsa.PrivateKey {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			panic(err)
		}
		return k
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	return testKeys{rsa: gen(), rsaOther: gen(), ec: ec, ed: ed}
})

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func rsaJWK(kid string, k *rsa.PrivateKey) map[string]any {
	return map[string]any{"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
		"n": b64(k.N.Bytes()), "e": b64(big.NewInt(int64(k.E)).Bytes())}
}

func ecJWK(kid string, k *ecdsa.PrivateKey) map[string]any {
	raw, err := k.PublicKey.Bytes() // 0x04 || X || Y
	if err != nil {
		panic(err)
	}
	return map[string]any{"kty": "EC", "kid": kid, "use": "sig", "crv": "P-256",
		"x": b64(raw[1:33]), "y": b64(raw[33:])}
}

func edJWK(kid string, k ed25519.PrivateKey) map[string]any {
	return map[string]any{"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": b64(k.Public().(ed25519.PublicKey))}
}

func baseJWKs() []map[string]any {
	k := keys()
	return []map[string]any{
		rsaJWK(kidRSA, k.rsa), ecJWK(kidEC, k.ec), edJWK(kidEd, k.ed),
		// Ignored: an encryption key, an unknown kty, an unsupported curve.
		{"kty": "RSA", "kid": "enc-1", "use": "enc", "n": b64(k.rsaOther.N.Bytes()), "e": "AQAB"},
		{"kty": "oct", "kid": "oct-1", "k": b64(devSecret)},
		{"kty": "EC", "kid": "p384", "crv": "P-384", "x": "AAAA", "y": "AAAA"},
	}
}

func jwksDoc(ks ...map[string]any) []byte {
	b, err := json.Marshal(map[string]any{"keys": ks})
	if err != nil {
		panic(err)
	}
	return b
}

// jwksServer serves a replaceable JWKS over real HTTP and counts its hits.
type jwksServer struct {
	*httptest.Server
	hits  atomic.Int64
	delay atomic.Int64 // nanoseconds each response waits (to overlap concurrent misses)
	fail  atomic.Bool  // answer 503 instead of the JWKS
	mu    sync.Mutex   // guards doc
	doc   []byte
}

func newJWKSServer(t testing.TB, ks ...map[string]any) *jwksServer {
	t.Helper()
	s := &jwksServer{doc: jwksDoc(ks...)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		if d := time.Duration(s.delay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done(): // the client gave up
				return
			}
		}
		if s.fail.Load() {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		s.mu.Lock()
		doc := s.doc
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_, _ = w.Write(doc)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) set(ks ...map[string]any) {
	s.mu.Lock()
	s.doc = jwksDoc(ks...)
	s.mu.Unlock()
}

// testClock is a Config.Now that only moves when the test says so, so the
// 10 s refetch gap is crossed without sleeping.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock { return &testClock{now: time.Now()} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newRedisClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func debugLogger(buf *testenv.LogBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newVerifier(t testing.TB, cfg auth.Config, logger *slog.Logger) *auth.Verifier {
	t.Helper()
	v, err := auth.NewVerifier(context.Background(), cfg, logger)
	if err != nil {
		t.Fatalf("NewVerifier: %v", err)
	}
	t.Cleanup(v.Close)
	return v
}

func sign(t testing.TB, m jwt.SigningMethod, key any, kid string, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	return s
}

// claimsAt returns valid user claims for a verifier whose clock reads now.
func claimsAt(now time.Time, edits ...func(jwt.MapClaims)) jwt.MapClaims {
	c := jwt.MapClaims{
		"sub": testSubject, "iss": testIssuer, "aud": testAudience,
		"iat": now.Unix(), "exp": now.Add(5 * time.Minute).Unix(),
	}
	for _, e := range edits {
		e(c)
	}
	return c
}

func set(k string, val any) func(jwt.MapClaims) { return func(c jwt.MapClaims) { c[k] = val } }
func del(k string) func(jwt.MapClaims)          { return func(c jwt.MapClaims) { delete(c, k) } }

func randomKID(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

func negativeKey(kid string) string {
	sum := sha256.Sum256([]byte(kid))
	return "han:api:jwks:negative:" + hex.EncodeToString(sum[:])
}

// withoutExpires drops the exp a principal carries, for comparisons of
// identity only.
func withoutExpires(p auth.Principal) auth.Principal {
	p.Expires = time.Time{}
	return p
}

func mustAccept(t *testing.T, v *auth.Verifier, token string) auth.Principal {
	t.Helper()
	p, err := v.Verify(context.Background(), token)
	if err != nil {
		t.Fatalf("Verify rejected a valid token: %v", err)
	}
	return p
}

// mustReject checks the rejection wraps ErrUnauthorized, names the expected
// reason, and carries no token text.
func mustReject(t *testing.T, v *auth.Verifier, token, reason string) error {
	t.Helper()
	p, err := v.Verify(context.Background(), token)
	if err == nil {
		t.Fatalf("Verify accepted a token it must reject: %+v", p)
	}
	if !errors.Is(err, auth.ErrUnauthorized) {
		t.Fatalf("error %v does not wrap ErrUnauthorized", err)
	}
	if p != (auth.Principal{}) {
		t.Fatalf("rejection returned a non-zero principal %+v", p)
	}
	if reason != "" && !strings.Contains(err.Error(), reason) {
		t.Fatalf("error %q does not name reason %q", err, reason)
	}
	if token != "" && strings.Contains(err.Error(), token) {
		t.Fatalf("error text contains the token")
	}
	for _, part := range strings.Split(token, ".") {
		if len(part) > 8 && strings.Contains(err.Error(), part) {
			t.Fatalf("error text contains part of the token")
		}
	}
	return err
}

func TestVerify(t *testing.T) {
	k := keys()
	srv := newJWKSServer(t, baseJWKs()...)
	rdb := newRedisClient(t, env.Redis.URL(0))
	now := time.Now().Truncate(time.Second)
	clock := func() time.Time { return now }
	var logs testenv.LogBuffer
	cfg := auth.Config{
		Issuer: testIssuer, Audience: testAudience, JWKSURL: srv.URL,
		Redis: rdb, HTTPClient: srv.Client(), Now: clock,
	}
	jwksOnly := newVerifier(t, cfg, debugLogger(&logs))
	cfgBoth := cfg
	cfgBoth.DevHS256Secret = devSecret
	both := newVerifier(t, cfgBoth, debugLogger(&logs))
	devOnly := newVerifier(t, auth.Config{DevHS256Secret: devSecret, Issuer: testIssuer, Audience: testAudience, Now: clock}, debugLogger(&logs))

	var tokens []string // every token used here, to prove none reached the logs
	tok := func(s string) string { tokens = append(tokens, s); return s }

	t.Run("valid RS256", func(t *testing.T) {
		p := mustAccept(t, jwksOnly, tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now))))
		if withoutExpires(p) != (auth.Principal{UserID: wantUserID, Kind: auth.KindUser}) {
			t.Fatalf("principal = %+v", p)
		}
		// The exp claim is exposed: a WebSocket ends at it (plus the leeway).
		if want := time.Unix(now.Add(5*time.Minute).Unix(), 0); !p.Expires.Equal(want) {
			t.Fatalf("Expires = %v, want %v", p.Expires, want)
		}
		if jwksOnly.Leeway() != 30*time.Second {
			t.Fatalf("default leeway = %v, want 30s", jwksOnly.Leeway())
		}
	})
	t.Run("valid ES256", func(t *testing.T) {
		p := mustAccept(t, jwksOnly, tok(sign(t, jwt.SigningMethodES256, k.ec, kidEC, claimsAt(now))))
		if p.UserID != wantUserID || p.Kind != auth.KindUser {
			t.Fatalf("principal = %+v", p)
		}
	})
	t.Run("valid EdDSA", func(t *testing.T) {
		p := mustAccept(t, jwksOnly, tok(sign(t, jwt.SigningMethodEdDSA, k.ed, kidEd, claimsAt(now))))
		if p.UserID != wantUserID {
			t.Fatalf("principal = %+v", p)
		}
	})
	t.Run("valid HS256 with the dev secret", func(t *testing.T) {
		minted, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: testSubject, Issuer: testIssuer, Audience: testAudience})
		if err != nil {
			t.Fatal(err)
		}
		// Minted with the real clock, so verify with a real-clock verifier.
		realClock := newVerifier(t, auth.Config{DevHS256Secret: devSecret, Issuer: testIssuer, Audience: testAudience}, debugLogger(&logs))
		if p := mustAccept(t, realClock, tok(minted)); withoutExpires(p) != (auth.Principal{UserID: wantUserID, Kind: auth.KindUser}) {
			t.Fatalf("principal = %+v", p)
		}
		mustAccept(t, devOnly, tok(sign(t, jwt.SigningMethodHS256, devSecret, "", claimsAt(now))))
		mustAccept(t, both, tok(sign(t, jwt.SigningMethodHS256, devSecret, "", claimsAt(now))))
	})
	t.Run("no token", func(t *testing.T) {
		mustReject(t, jwksOnly, "", "no token")
	})
	t.Run("malformed token", func(t *testing.T) {
		for _, s := range []string{"abc", "a.b", "a.b.c", "not.a.jwt", "....", strings.Repeat("x", 9000),
			"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOjF9.AAAA"} {
			err := mustReject(t, jwksOnly, tok(s), "")
			if errors.Is(err, jwt.ErrTokenExpired) {
				t.Fatalf("%q: unexpected reason %v", s, err)
			}
		}
		good := sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now))
		parts := strings.Split(good, ".")
		mustReject(t, jwksOnly, tok(parts[0]+"."+parts[1]+"!."+parts[2]), "malformed")
	})
	t.Run("bad signature", func(t *testing.T) {
		// Signed by a different RSA key under the trusted kid.
		s := tok(sign(t, jwt.SigningMethodRS256, k.rsaOther, kidRSA, claimsAt(now)))
		if err := mustReject(t, jwksOnly, s, ""); !errors.Is(err, jwt.ErrTokenSignatureInvalid) {
			t.Fatalf("reason = %v", err)
		}
		// A valid token whose payload was swapped for another subject.
		good := strings.Split(sign(t, jwt.SigningMethodES256, k.ec, kidEC, claimsAt(now)), ".")
		other := strings.Split(sign(t, jwt.SigningMethodES256, k.ec, kidEC, claimsAt(now, set("sub", "11111111-2222-3333-4444-555555555555"))), ".")
		if err := mustReject(t, jwksOnly, tok(good[0]+"."+other[1]+"."+good[2]), ""); !errors.Is(err, jwt.ErrTokenSignatureInvalid) {
			t.Fatalf("reason = %v", err)
		}
		mustReject(t, both, tok(sign(t, jwt.SigningMethodHS256, []byte("another-secret-another-secret-0123"), "", claimsAt(now))), "signature")
	})
	t.Run("expired beyond leeway", func(t *testing.T) {
		s := tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, set("iat", now.Add(-time.Hour).Unix()), set("exp", now.Add(-31*time.Second).Unix()))))
		if err := mustReject(t, jwksOnly, s, ""); !errors.Is(err, jwt.ErrTokenExpired) {
			t.Fatalf("reason = %v", err)
		}
	})
	t.Run("expired within leeway accepted", func(t *testing.T) {
		mustAccept(t, jwksOnly, tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, set("iat", now.Add(-time.Hour).Unix()), set("exp", now.Add(-29*time.Second).Unix())))))
	})
	t.Run("missing exp", func(t *testing.T) {
		if err := mustReject(t, jwksOnly, tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, del("exp")))), ""); !errors.Is(err, jwt.ErrTokenRequiredClaimMissing) {
			t.Fatalf("reason = %v", err)
		}
	})
	t.Run("nbf in the future", func(t *testing.T) {
		s := tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, set("nbf", now.Add(time.Minute).Unix()))))
		if err := mustReject(t, jwksOnly, s, ""); !errors.Is(err, jwt.ErrTokenNotValidYet) {
			t.Fatalf("reason = %v", err)
		}
		// Within leeway, nbf is fine.
		mustAccept(t, jwksOnly, tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, set("nbf", now.Add(20*time.Second).Unix())))))
	})
	t.Run("iat in the future", func(t *testing.T) {
		s := tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, set("iat", now.Add(2*time.Minute).Unix()))))
		if err := mustReject(t, jwksOnly, s, ""); !errors.Is(err, jwt.ErrTokenUsedBeforeIssued) {
			t.Fatalf("reason = %v", err)
		}
	})
	t.Run("wrong iss", func(t *testing.T) {
		s := tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, set("iss", "https://evil.test"))))
		if err := mustReject(t, jwksOnly, s, ""); !errors.Is(err, jwt.ErrTokenInvalidIssuer) {
			t.Fatalf("reason = %v", err)
		}
		s = tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, del("iss"))))
		if err := mustReject(t, jwksOnly, s, ""); !errors.Is(err, jwt.ErrTokenRequiredClaimMissing) {
			t.Fatalf("reason = %v", err)
		}
	})
	t.Run("wrong aud", func(t *testing.T) {
		for _, c := range []jwt.MapClaims{claimsAt(now, set("aud", "other-api")), claimsAt(now, set("aud", []string{"a", "b"}))} {
			if err := mustReject(t, jwksOnly, tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, c)), ""); !errors.Is(err, jwt.ErrTokenInvalidAudience) {
				t.Fatalf("reason = %v", err)
			}
		}
		s := tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, del("aud"))))
		if err := mustReject(t, jwksOnly, s, ""); !errors.Is(err, jwt.ErrTokenRequiredClaimMissing) {
			t.Fatalf("reason = %v", err)
		}
		// aud as an array containing ours is fine.
		mustAccept(t, jwksOnly, tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, set("aud", []string{"x", testAudience})))))
	})
	t.Run("missing sub", func(t *testing.T) {
		mustReject(t, jwksOnly, tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, del("sub")))), "sub claim")
	})
	t.Run("non-UUID sub", func(t *testing.T) {
		for _, sub := range []string{"user-1", "7a1c7e4b2f3d4c5e8a9b0c1d2e3f4a5b", "{7a1c7e4b-2f3d-4c5e-8a9b-0c1d2e3f4a5b}",
			"7a1c7e4b-2f3d-4c5e-8a9b-0c1d2e3f4a5g", "00000000-0000-0000-0000-000000000000"} {
			mustReject(t, jwksOnly, tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now, set("sub", sub)))), "sub claim")
		}
	})
	t.Run("alg none", func(t *testing.T) {
		s := tok(sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, kidRSA, claimsAt(now)))
		mustReject(t, jwksOnly, s, "algorithm")
		mustReject(t, both, s, "algorithm")
		// Hand-built variants: upper-case NONE and an empty signature on a known kid.
		hdr := b64([]byte(`{"alg":"NONE","kid":"` + kidRSA + `"}`))
		body := strings.Split(s, ".")[1]
		mustReject(t, both, tok(hdr+"."+body+"."), "")
	})
	t.Run("HS256 token when only JWKS is configured", func(t *testing.T) {
		minted, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: testSubject, Issuer: testIssuer, Audience: testAudience})
		if err != nil {
			t.Fatal(err)
		}
		mustReject(t, jwksOnly, tok(minted), "algorithm")
	})
	t.Run("HS256 signed with the RSA public key PEM as secret", func(t *testing.T) {
		der, err := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
		s := tok(sign(t, jwt.SigningMethodHS256, pemKey, kidRSA, claimsAt(now)))
		mustReject(t, jwksOnly, s, "algorithm")
		if err := mustReject(t, both, s, ""); !errors.Is(err, jwt.ErrTokenSignatureInvalid) {
			t.Fatalf("reason = %v", err)
		}
		// The raw modulus and the DER bytes are no better.
		mustReject(t, both, tok(sign(t, jwt.SigningMethodHS256, der, kidRSA, claimsAt(now))), "signature")
	})
	t.Run("RS256 header with a kid that names an EC key", func(t *testing.T) {
		before := srv.hits.Load()
		s := tok(sign(t, jwt.SigningMethodRS256, k.rsa, kidEC, claimsAt(now)))
		mustReject(t, jwksOnly, s, "key type does not match alg")
		// ES256 naming the RSA kid and EdDSA naming the EC kid are refused the same way.
		mustReject(t, jwksOnly, tok(sign(t, jwt.SigningMethodES256, k.ec, kidRSA, claimsAt(now))), "key type does not match alg")
		mustReject(t, jwksOnly, tok(sign(t, jwt.SigningMethodEdDSA, k.ed, kidEC, claimsAt(now))), "key type does not match alg")
		if got := srv.hits.Load(); got != before {
			t.Fatalf("a known kid with the wrong key type caused %d JWKS fetches", got-before)
		}
	})
	t.Run("ignored JWKS keys are not usable", func(t *testing.T) {
		// enc-1 is the other RSA key published with use=enc.
		mustReject(t, jwksOnly, tok(sign(t, jwt.SigningMethodRS256, k.rsaOther, "enc-1", claimsAt(now))), "")
	})
	t.Run("typ=service gives KindService and svc", func(t *testing.T) {
		s := tok(sign(t, jwt.SigningMethodES256, k.ec, kidEC, claimsAt(now, set("typ", "service"), set("svc", "notifier"))))
		p := mustAccept(t, jwksOnly, s)
		if withoutExpires(p) != (auth.Principal{UserID: wantUserID, Kind: auth.KindService, Service: "notifier"}) {
			t.Fatalf("principal = %+v", p)
		}
		p = mustAccept(t, jwksOnly, tok(sign(t, jwt.SigningMethodES256, k.ec, kidEC, claimsAt(now, set("typ", "service")))))
		if p.Kind != auth.KindService || p.Service != "" {
			t.Fatalf("principal = %+v", p)
		}
		p = mustAccept(t, jwksOnly, tok(sign(t, jwt.SigningMethodES256, k.ec, kidEC, claimsAt(now, set("typ", "user"), set("svc", "ignored")))))
		if withoutExpires(p) != (auth.Principal{UserID: wantUserID, Kind: auth.KindUser}) {
			t.Fatalf("user token principal = %+v", p)
		}
	})
	t.Run("typ=bogus rejected", func(t *testing.T) {
		for _, typ := range []any{"bogus", "", "USER", 1} {
			mustReject(t, jwksOnly, tok(sign(t, jwt.SigningMethodES256, k.ec, kidEC, claimsAt(now, set("typ", typ)))), "")
		}
	})
	t.Run("invalid svc rejected", func(t *testing.T) {
		for _, svc := range []string{"a:b", "with space", strings.Repeat("s", 65)} {
			mustReject(t, jwksOnly, tok(sign(t, jwt.SigningMethodES256, k.ec, kidEC, claimsAt(now, set("typ", "service"), set("svc", svc)))), "svc")
		}
	})
	t.Run("crit header rejected", func(t *testing.T) {
		tk := jwt.NewWithClaims(jwt.SigningMethodRS256, claimsAt(now))
		tk.Header["kid"] = kidRSA
		tk.Header["crit"] = []string{"exp"}
		s, err := tk.SignedString(k.rsa)
		if err != nil {
			t.Fatal(err)
		}
		mustReject(t, jwksOnly, tok(s), "crit")
	})

	out := logs.String()
	if !strings.Contains(out, "token rejected") {
		t.Fatalf("debug log has no rejections; the leak check below would be vacuous:\n%s", out)
	}
	for _, s := range tokens {
		for _, part := range strings.Split(s, ".") {
			if len(part) > 8 && strings.Contains(out, part) {
				t.Fatalf("logs contain token text")
			}
		}
	}
	for _, val := range []string{wantUserID, testSubject, "notifier", "https://evil.test", "other-api"} {
		if strings.Contains(out, val) {
			t.Fatalf("logs contain claim value %q", val)
		}
	}
}

// Claim names are case-sensitive: custom claims an identity provider puts
// in its tokens under names like "TYP", "SUB" or "EXP" are unknown claims,
// ignored like any other. They never change the principal nor stand in for
// a claim the token lacks.
func TestClaimNamesMatchOnlyInTheirExactCase(t *testing.T) {
	k := keys()
	srv := newJWKSServer(t, baseJWKs()...)
	clock := newTestClock()
	v := newVerifier(t, auth.Config{JWKSURL: srv.URL, HTTPClient: srv.Client(), Issuer: testIssuer, Audience: testAudience, Now: clock.Now}, nil)
	now := clock.Now()
	rs256 := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, c) }
	user := auth.Principal{UserID: wantUserID, Kind: auth.KindUser}

	t.Run("a custom TYP claim does not make a user token a service token", func(t *testing.T) {
		for _, c := range []jwt.MapClaims{
			claimsAt(now, set("TYP", "service"), set("SVC", "billing")),
			claimsAt(now, set("Typ", "service"), set("Svc", "billing")),
			claimsAt(now, set("typ", "user"), set("TYP", "service")),
		} {
			if p := mustAccept(t, v, rs256(c)); withoutExpires(p) != user {
				t.Fatalf("claims %v verified as %+v, want a user token", c, withoutExpires(p))
			}
		}
	})
	t.Run("a custom SUB claim neither replaces nor stands in for sub", func(t *testing.T) {
		other := "11111111-2222-4333-8444-555555555555"
		mustReject(t, v, rs256(claimsAt(now, del("sub"), set("SUB", other))), "sub claim")
		if p := mustAccept(t, v, rs256(claimsAt(now, set("Sub", other)))); p.UserID != wantUserID {
			t.Fatalf("principal %q, want the sub claim's %q", p.UserID, wantUserID)
		}
	})
	t.Run("a custom EXP claim does not stand in for exp", func(t *testing.T) {
		c := claimsAt(now)
		c["EXP"] = c["exp"]
		delete(c, "exp")
		if err := mustReject(t, v, rs256(c), ""); !errors.Is(err, jwt.ErrTokenRequiredClaimMissing) {
			t.Fatalf("reason = %v, want the missing exp", err)
		}
		// Nor does a far-off one extend an expired token.
		c = claimsAt(now, set("iat", now.Add(-time.Hour).Unix()), set("exp", now.Add(-time.Minute).Unix()), set("Exp", now.Add(time.Hour).Unix()))
		if err := mustReject(t, v, rs256(c), ""); !errors.Is(err, jwt.ErrTokenExpired) {
			t.Fatalf("reason = %v, want expired", err)
		}
	})
	t.Run("custom ISS and AUD claims do not satisfy the configured issuer and audience", func(t *testing.T) {
		if err := mustReject(t, v, rs256(claimsAt(now, del("iss"), set("ISS", testIssuer))), ""); !errors.Is(err, jwt.ErrTokenRequiredClaimMissing) {
			t.Fatalf("reason = %v", err)
		}
		if err := mustReject(t, v, rs256(claimsAt(now, del("aud"), set("Aud", testAudience))), ""); !errors.Is(err, jwt.ErrTokenRequiredClaimMissing) {
			t.Fatalf("reason = %v", err)
		}
	})
}

func TestUnknownKID(t *testing.T) {
	k := keys()
	srv := newJWKSServer(t, baseJWKs()...)
	rdb := newRedisClient(t, env.Redis.URL(0))
	cfg := auth.Config{JWKSURL: srv.URL, Redis: rdb, HTTPClient: srv.Client()}
	v := newVerifier(t, cfg, nil)
	now := time.Now()
	kid := randomKID("unknown")

	t.Run("unknown kid refetches once and sets the negative marker", func(t *testing.T) {
		before := srv.hits.Load()
		mustReject(t, v, sign(t, jwt.SigningMethodRS256, k.rsaOther, kid, claimsAt(now, del("iss"), del("aud"))), "unknown key id")
		if got := srv.hits.Load() - before; got != 1 {
			t.Fatalf("JWKS fetches = %d, want exactly 1", got)
		}
		ttl, err := rdb.PTTL(context.Background(), negativeKey(kid)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > 30*time.Second {
			t.Fatalf("negative marker TTL = %v, want in (0, 30s]", ttl)
		}
	})
	t.Run("second token with that kid causes no fetch", func(t *testing.T) {
		before := srv.hits.Load()
		mustReject(t, v, sign(t, jwt.SigningMethodES256, k.ec, kid, claimsAt(now, del("iss"), del("aud"))), "unknown key id")
		if got := srv.hits.Load() - before; got != 0 {
			t.Fatalf("JWKS fetches = %d, want 0", got)
		}
	})
	t.Run("another instance honours the marker without fetching", func(t *testing.T) {
		other := newVerifier(t, cfg, nil) // loads the JWKS once at startup
		before := srv.hits.Load()
		mustReject(t, other, sign(t, jwt.SigningMethodRS256, k.rsaOther, kid, claimsAt(now, del("iss"), del("aud"))), "unknown key id")
		if got := srv.hits.Load() - before; got != 0 {
			t.Fatalf("JWKS fetches = %d, want 0 (the Redis marker should have answered)", got)
		}
	})
	t.Run("without Redis the local limit still holds", func(t *testing.T) {
		local := newVerifier(t, auth.Config{JWKSURL: srv.URL, HTTPClient: srv.Client()}, nil)
		kid := randomKID("local")
		before := srv.hits.Load()
		for range 5 {
			mustReject(t, local, sign(t, jwt.SigningMethodRS256, k.rsaOther, kid, claimsAt(now, del("iss"), del("aud"))), "unknown key id")
		}
		if got := srv.hits.Load() - before; got != 1 {
			t.Fatalf("JWKS fetches = %d, want 1", got)
		}
	})
	t.Run("refetch allowed again after the interval", func(t *testing.T) {
		var mu sync.Mutex
		clock := time.Now()
		now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
		local := newVerifier(t, auth.Config{JWKSURL: srv.URL, HTTPClient: srv.Client(), Now: now}, nil)
		kid := randomKID("interval")
		tokenAt := sign(t, jwt.SigningMethodRS256, k.rsaOther, kid, claimsAt(clock, del("iss"), del("aud")))
		before := srv.hits.Load()
		mustReject(t, local, tokenAt, "unknown key id")
		mu.Lock()
		clock = clock.Add(29 * time.Second)
		mu.Unlock()
		mustReject(t, local, tokenAt, "unknown key id")
		mu.Lock()
		clock = clock.Add(2 * time.Second)
		mu.Unlock()
		mustReject(t, local, tokenAt, "unknown key id")
		if got := srv.hits.Load() - before; got != 2 {
			t.Fatalf("JWKS fetches = %d, want 2 (one per 30s interval)", got)
		}
	})
}

func TestRotation(t *testing.T) {
	k := keys()
	srv := newJWKSServer(t, baseJWKs()...)
	rdb := newRedisClient(t, env.Redis.URL(0))
	clock := newTestClock()
	v := newVerifier(t, auth.Config{JWKSURL: srv.URL, Redis: rdb, HTTPClient: srv.Client(), Now: clock.Now}, nil)
	now := clock.Now()

	t.Run("a key added to the JWKS is picked up on the first token naming it", func(t *testing.T) {
		newKID := randomKID("rotated")
		srv.set(append(baseJWKs(), rsaJWK(newKID, k.rsaOther))...)
		before := srv.hits.Load()
		p := mustAccept(t, v, sign(t, jwt.SigningMethodRS256, k.rsaOther, newKID, claimsAt(now)))
		if p.UserID != wantUserID {
			t.Fatalf("principal = %+v", p)
		}
		mustAccept(t, v, sign(t, jwt.SigningMethodRS256, k.rsaOther, newKID, claimsAt(now)))
		mustAccept(t, v, sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now)))
		if got := srv.hits.Load() - before; got != 1 {
			t.Fatalf("JWKS fetches = %d, want 1", got)
		}
		if n, _ := rdb.Exists(context.Background(), negativeKey(newKID)).Result(); n != 0 {
			t.Fatal("a kid that was found got a negative marker")
		}
	})
	t.Run("a key removed from the JWKS stops verifying after a refetch", func(t *testing.T) {
		clock.Advance(10 * time.Second) // past the per-source refetch gap
		third := randomKID("third")
		srv.set(rsaJWK(third, k.rsaOther), ecJWK(kidEC, k.ec))
		mustAccept(t, v, sign(t, jwt.SigningMethodRS256, k.rsaOther, third, claimsAt(now)))
		mustReject(t, v, sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now)), "unknown key id")
	})
	t.Run("concurrent misses for one kid share one fetch", func(t *testing.T) {
		clock.Advance(10 * time.Second)
		newKID := randomKID("concurrent")
		srv.set(append(baseJWKs(), ecJWK(newKID, k.ec))...)
		srv.delay.Store(int64(100 * time.Millisecond))
		defer srv.delay.Store(0)
		token := sign(t, jwt.SigningMethodES256, k.ec, newKID, claimsAt(now))
		before := srv.hits.Load()
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for range 32 {
			wg.Go(func() {
				if _, err := v.Verify(context.Background(), token); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("concurrent Verify: %v", err)
		}
		if got := srv.hits.Load() - before; got != 1 {
			t.Fatalf("JWKS fetches = %d, want 1", got)
		}
	})
	t.Run("JWKS file is re-read on refetch", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "jwks.json")
		if err := os.WriteFile(path, jwksDoc(rsaJWK(kidRSA, k.rsa)), 0o600); err != nil {
			t.Fatal(err)
		}
		fv := newVerifier(t, auth.Config{JWKSFile: path}, nil)
		mustAccept(t, fv, sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now)))
		newKID := randomKID("file")
		if err := os.WriteFile(path, jwksDoc(rsaJWK(kidRSA, k.rsa), edJWK(newKID, k.ed)), 0o600); err != nil {
			t.Fatal(err)
		}
		mustAccept(t, fv, sign(t, jwt.SigningMethodEdDSA, k.ed, newKID, claimsAt(now)))
	})
}

func TestRedisDown(t *testing.T) {
	k := keys()
	down, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rdb := newRedisClient(t, down.URL(0))
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("private redis not reachable before the stop: %v", err)
	}
	down.Stop()

	srv := newJWKSServer(t, baseJWKs()...)
	clock := newTestClock()
	v := newVerifier(t, auth.Config{JWKSURL: srv.URL, Redis: rdb, HTTPClient: srv.Client(), Now: clock.Now}, nil)
	now := clock.Now()

	t.Run("Verify with Redis stopped still accepts a valid token", func(t *testing.T) {
		mustAccept(t, v, sign(t, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(now)))
		// A new kid goes through the (failing) negative-cache read first.
		newKID := randomKID("redis-down")
		srv.set(append(baseJWKs(), edJWK(newKID, k.ed))...)
		start := time.Now()
		mustAccept(t, v, sign(t, jwt.SigningMethodEdDSA, k.ed, newKID, claimsAt(now)))
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("Verify took %v with Redis down", d)
		}
	})
	t.Run("unknown kid with Redis stopped falls back to the local limit", func(t *testing.T) {
		clock.Advance(10 * time.Second) // past the per-source refetch gap
		kid := randomKID("redis-down-unknown")
		before := srv.hits.Load()
		for range 3 {
			mustReject(t, v, sign(t, jwt.SigningMethodRS256, k.rsaOther, kid, claimsAt(now)), "unknown key id")
		}
		if got := srv.hits.Load() - before; got != 1 {
			t.Fatalf("JWKS fetches = %d, want 1", got)
		}
	})
}

func TestNewVerifier(t *testing.T) {
	srv := newJWKSServer(t, baseJWKs()...)
	ctx := context.Background()
	t.Run("Env prod with a dev secret fails", func(t *testing.T) {
		for _, cfg := range []auth.Config{
			{Env: "prod", DevHS256Secret: devSecret},
			{Env: "prod", DevHS256Secret: devSecret, JWKSURL: srv.URL, HTTPClient: srv.Client()},
			{Env: "PROD", DevHS256Secret: devSecret},
		} {
			if v, err := auth.NewVerifier(ctx, cfg, nil); err == nil || v != nil {
				t.Fatalf("NewVerifier(%q with dev secret) = %v, %v; want an error", cfg.Env, v, err)
			}
		}
	})
	t.Run("Env prod requires an https JWKS URL", func(t *testing.T) {
		if _, err := auth.NewVerifier(ctx, auth.Config{Env: "prod", JWKSURL: srv.URL, HTTPClient: srv.Client()}, nil); err == nil {
			t.Fatal("want an error for http JWKS in prod")
		}
	})
	t.Run("no key source", func(t *testing.T) {
		if _, err := auth.NewVerifier(ctx, auth.Config{}, nil); !errors.Is(err, auth.ErrNoKeys) {
			t.Fatalf("err = %v, want ErrNoKeys", err)
		}
	})
	t.Run("JWKS with no usable key", func(t *testing.T) {
		empty := newJWKSServer(t, map[string]any{"kty": "oct", "k": "AAAA"})
		if _, err := auth.NewVerifier(ctx, auth.Config{JWKSURL: empty.URL, HTTPClient: empty.Client()}, nil); !errors.Is(err, auth.ErrNoKeys) {
			t.Fatalf("err = %v, want ErrNoKeys", err)
		}
	})
	t.Run("JWKS that cannot be loaded fails startup", func(t *testing.T) {
		dead := httptest.NewServer(http.NotFoundHandler())
		defer dead.Close()
		if _, err := auth.NewVerifier(ctx, auth.Config{JWKSURL: dead.URL, HTTPClient: dead.Client()}, nil); err == nil {
			t.Fatal("want an error for a 404 JWKS")
		}
		if _, err := auth.NewVerifier(ctx, auth.Config{JWKSFile: filepath.Join(t.TempDir(), "missing.json")}, nil); err == nil {
			t.Fatal("want an error for a missing JWKS file")
		}
		bad := filepath.Join(t.TempDir(), "bad.json")
		if err := os.WriteFile(bad, []byte(`{"keys":`), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := auth.NewVerifier(ctx, auth.Config{JWKSFile: bad}, nil); err == nil {
			t.Fatal("want an error for an invalid JWKS document")
		}
	})
	t.Run("invalid configs", func(t *testing.T) {
		for name, cfg := range map[string]auth.Config{
			"short dev secret": {DevHS256Secret: []byte("short")},
			"both sources":     {JWKSURL: srv.URL, JWKSFile: "/x"},
			"relative URL":     {JWKSURL: "/jwks.json"},
			"negative leeway":  {DevHS256Secret: devSecret, Leeway: -time.Second},
		} {
			if _, err := auth.NewVerifier(ctx, cfg, nil); err == nil {
				t.Errorf("%s: want an error", name)
			}
		}
	})
}

func TestBearerToken(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers []string
		want    string
		ok      bool
	}{
		{"bearer", []string{"Bearer abc.def.ghi"}, "abc.def.ghi", true},
		{"case-insensitive scheme", []string{"bEaReR abc"}, "abc", true},
		{"extra spaces", []string{"Bearer   abc  "}, "abc", true},
		{"no header", nil, "", false},
		{"basic", []string{"Basic dXNlcjpwYXNz"}, "", false},
		{"empty token", []string{"Bearer "}, "", false},
		{"scheme only", []string{"Bearer"}, "", false},
		{"token with space", []string{"Bearer a b"}, "", false},
		{"two headers", []string{"Bearer a", "Bearer b"}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			for _, h := range tc.headers {
				r.Header.Add("Authorization", h)
			}
			got, ok := auth.BearerToken(r)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("BearerToken = %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestPrincipalContext(t *testing.T) {
	if _, ok := auth.PrincipalFrom(context.Background()); ok {
		t.Fatal("empty context has a principal")
	}
	want := auth.Principal{UserID: wantUserID, Kind: auth.KindService, Service: "notifier"}
	got, ok := auth.PrincipalFrom(auth.WithPrincipal(context.Background(), want))
	if !ok || got != want {
		t.Fatalf("PrincipalFrom = %+v, %v", got, ok)
	}
}

func TestMintDevToken(t *testing.T) {
	v := newVerifier(t, auth.Config{DevHS256Secret: devSecret, Issuer: testIssuer}, nil)
	t.Run("service token round trip", func(t *testing.T) {
		s, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: testSubject, Kind: auth.KindService, Service: "seed", Issuer: testIssuer, KeyID: "dev"})
		if err != nil {
			t.Fatal(err)
		}
		if p := mustAccept(t, v, s); withoutExpires(p) != (auth.Principal{UserID: wantUserID, Kind: auth.KindService, Service: "seed"}) {
			t.Fatalf("principal = %+v", p)
		}
	})
	t.Run("negative TTL mints an expired token", func(t *testing.T) {
		s, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: testSubject, Issuer: testIssuer, TTL: -time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := mustReject(t, v, s, ""); !errors.Is(err, jwt.ErrTokenExpired) {
			t.Fatalf("reason = %v", err)
		}
	})
	t.Run("invalid input", func(t *testing.T) {
		for name, c := range map[string]auth.DevClaims{
			"non-UUID subject": {Subject: "alice"},
			"unknown kind":     {Subject: testSubject, Kind: "admin"},
			"bad service":      {Subject: testSubject, Service: "a:b"},
		} {
			if _, err := auth.MintDevToken(devSecret, c); err == nil {
				t.Errorf("%s: want an error", name)
			}
		}
		if _, err := auth.MintDevToken([]byte("short"), auth.DevClaims{Subject: testSubject}); err == nil {
			t.Error("short secret: want an error")
		}
	})
}

func BenchmarkVerifyRS256(b *testing.B) {
	k := keys()
	path := filepath.Join(b.TempDir(), "jwks.json")
	if err := os.WriteFile(path, jwksDoc(baseJWKs()...), 0o600); err != nil {
		b.Fatal(err)
	}
	v := newVerifier(b, auth.Config{JWKSFile: path, Issuer: testIssuer, Audience: testAudience}, nil)
	token := sign(b, jwt.SigningMethodRS256, k.rsa, kidRSA, claimsAt(time.Now()))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, token); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyHS256(b *testing.B) {
	v := newVerifier(b, auth.Config{DevHS256Secret: devSecret, Issuer: testIssuer, Audience: testAudience}, nil)
	token := sign(b, jwt.SigningMethodHS256, devSecret, "", claimsAt(time.Now()))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, token); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyHS256FreshTokens verifies tokens never seen before (no
// verified-cache hit), as a reconnect storm's handshakes bring them: the
// full parse, claims decoding and signature check of each.
func BenchmarkVerifyHS256FreshTokens(b *testing.B) {
	v := newVerifier(b, auth.Config{DevHS256Secret: devSecret, Issuer: testIssuer, Audience: testAudience}, nil)
	const n = 4096
	tokens := make([]string, n)
	now := time.Now()
	for i := range tokens {
		tokens[i] = sign(b, jwt.SigningMethodHS256, devSecret, "", claimsAt(now, set("jti", strconv.Itoa(i))))
	}
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i%n == 0 {
			b.StopTimer()
			v = newVerifier(b, auth.Config{DevHS256Secret: devSecret, Issuer: testIssuer, Audience: testAudience}, nil)
			b.StartTimer()
		}
		if _, err := v.Verify(ctx, tokens[i%n]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// The token's times are read as golang-jwt reads them, whatever form their
// number takes: the whole seconds every issuer writes, fractions, exponents,
// quoted numbers, and what is not a number at all.
func TestTimeClaimsReadAsTheLibraryReadsThem(t *testing.T) {
	for _, raw := range []string{
		"0", "1", "1700000000", "999999999999999", "1000000000000000", "99999999999999999999",
		"1700000000.5", "1700000000.999999999", "1.7e9", "1.7E+9", "17e8", "-1", "-1700000000",
		"01", "00", "1700000000.", ".5", "1_700", "0x10", "Inf", "NaN", "1e400",
		`"1700000000"`, `"1.5"`, `"abc"`, "true", "null", "[]", "{}", "", " 1700000000", "1700000000 ",
	} {
		want := new(jwt.NumericDate)
		wantErr := want.UnmarshalJSON([]byte(raw))
		got, err := auth.ReadNumericDate([]byte(raw))
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: error %v, golang-jwt's %v", raw, err, wantErr)
		}
		if err == nil && !got.Time.Equal(want.Time) {
			t.Fatalf("%q: %v, golang-jwt reads %v", raw, got.Time, want.Time)
		}
	}
}
