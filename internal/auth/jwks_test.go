package auth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"errors"
	"maps"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/han-app/gateway/internal/auth"
)

// floodToken is a well-formed, unauthenticated token naming a random kid:
// what an attacker can mint without any key the JWKS holds.
func floodToken(t *testing.T, now time.Time) string {
	t.Helper()
	return sign(t, jwt.SigningMethodEdDSA, keys().ed, randomKID("flood"), claimsAt(now))
}

func TestRefetchLimitPerSource(t *testing.T) {
	rdb := newRedisClient(t, env.Redis.URL(0))

	for _, withRedis := range []bool{true, false} {
		name := "without Redis"
		if withRedis {
			name = "with Redis"
		}
		t.Run("300 random kids over 30 s cause at most one fetch per 10 s, "+name, func(t *testing.T) {
			srv := newJWKSServer(t, baseJWKs()...)
			clock := newTestClock()
			cfg := auth.Config{JWKSURL: srv.URL, HTTPClient: srv.Client(), Now: clock.Now}
			if withRedis {
				cfg.Redis = rdb
			}
			v := newVerifier(t, cfg, nil)
			start := clock.Now()
			var fetchedAt []time.Time
			for range 300 {
				before := srv.hits.Load()
				mustReject(t, v, floodToken(t, start), "unknown key id")
				switch srv.hits.Load() - before {
				case 0:
				case 1:
					fetchedAt = append(fetchedAt, clock.Now())
				default:
					t.Fatalf("one token caused %d JWKS fetches", srv.hits.Load()-before)
				}
				clock.Advance(100 * time.Millisecond)
			}
			// 300 tokens 100 ms apart span 30 s: one fetch at 0 s, 10 s and 20 s.
			if len(fetchedAt) != 3 {
				t.Fatalf("JWKS fetches = %d, want 3 (one per 10 s window over 30 s)", len(fetchedAt))
			}
			for i := 1; i < len(fetchedAt); i++ {
				if gap := fetchedAt[i].Sub(fetchedAt[i-1]); gap < 10*time.Second {
					t.Fatalf("fetches %v apart, want at least 10 s", gap)
				}
			}
		})
	}

	t.Run("300 concurrent random kids share one fetch", func(t *testing.T) {
		srv := newJWKSServer(t, baseJWKs()...)
		clock := newTestClock()
		v := newVerifier(t, auth.Config{JWKSURL: srv.URL, Redis: rdb, HTTPClient: srv.Client(), Now: clock.Now}, nil)
		srv.delay.Store(int64(50 * time.Millisecond)) // keep the fetch open while the others arrive
		tokens := make([]string, 300)
		for i := range tokens {
			tokens[i] = floodToken(t, clock.Now())
		}
		before := srv.hits.Load()
		var wg sync.WaitGroup
		accepted := make(chan struct{}, len(tokens))
		for _, tok := range tokens {
			wg.Go(func() {
				if _, err := v.Verify(context.Background(), tok); err == nil {
					accepted <- struct{}{}
				}
			})
		}
		wg.Wait()
		if len(accepted) > 0 {
			t.Fatalf("%d tokens with unknown kids were accepted", len(accepted))
		}
		if got := srv.hits.Load() - before; got != 1 {
			t.Fatalf("JWKS fetches = %d, want 1", got)
		}
	})

	t.Run("a rotated key is accepted within 10 s of its first use during a flood", func(t *testing.T) {
		k := keys()
		srv := newJWKSServer(t, baseJWKs()...)
		clock := newTestClock()
		v := newVerifier(t, auth.Config{JWKSURL: srv.URL, Redis: rdb, HTTPClient: srv.Client(), Now: clock.Now}, nil)
		start := clock.Now()

		mustReject(t, v, floodToken(t, start), "unknown key id") // the flood's fetch opens a 10 s gap
		fetches := srv.hits.Load()
		clock.Advance(500 * time.Millisecond)

		rotated := randomKID("rotated")
		srv.set(append(baseJWKs(), rsaJWK(rotated, k.rsaOther))...)
		token := sign(t, jwt.SigningMethodRS256, k.rsaOther, rotated, claimsAt(start))
		firstUse := clock.Now()
		// Inside the gap the new kid cannot be fetched yet: rejected, and
		// neither remembered nor marked as unknown.
		mustReject(t, v, token, "unknown key id")
		if n, _ := rdb.Exists(context.Background(), negativeKey(rotated)).Result(); n != 0 {
			t.Fatal("a kid that was never looked up got a negative marker")
		}
		for clock.Now().Sub(firstUse) < 9*time.Second {
			mustReject(t, v, floodToken(t, start), "unknown key id")
			clock.Advance(250 * time.Millisecond)
		}
		if got := srv.hits.Load(); got != fetches {
			t.Fatalf("the flood caused %d fetches inside the 10 s gap", got-fetches)
		}

		var acceptedAt time.Time
		for clock.Now().Sub(firstUse) <= 10*time.Second {
			if _, err := v.Verify(context.Background(), token); err == nil {
				acceptedAt = clock.Now()
				break
			}
			clock.Advance(250 * time.Millisecond)
		}
		if acceptedAt.IsZero() {
			t.Fatal("the rotated key was still rejected 10 s after its first use")
		}
		if got := srv.hits.Load() - fetches; got != 1 {
			t.Fatalf("JWKS fetches after the gap = %d, want 1", got)
		}
		mustAccept(t, v, token)
	})

	t.Run("a rotated key is found by the fetch a flood token triggers after the gap", func(t *testing.T) {
		k := keys()
		srv := newJWKSServer(t, baseJWKs()...)
		clock := newTestClock()
		v := newVerifier(t, auth.Config{JWKSURL: srv.URL, Redis: rdb, HTTPClient: srv.Client(), Now: clock.Now}, nil)
		start := clock.Now()
		mustReject(t, v, floodToken(t, start), "unknown key id")

		rotated := randomKID("rotated")
		srv.set(append(baseJWKs(), edJWK(rotated, k.ed))...)
		token := sign(t, jwt.SigningMethodEdDSA, k.ed, rotated, claimsAt(start))
		clock.Advance(time.Second)
		mustReject(t, v, token, "unknown key id")
		clock.Advance(9 * time.Second)
		mustReject(t, v, floodToken(t, start), "unknown key id")
		fetches := srv.hits.Load()
		mustAccept(t, v, token)
		if got := srv.hits.Load() - fetches; got != 0 {
			t.Fatalf("JWKS fetches = %d, want 0 (the flood's fetch already loaded the key)", got)
		}
	})

	t.Run("a failing JWKS endpoint is also fetched at most once per 10 s", func(t *testing.T) {
		srv := newJWKSServer(t, baseJWKs()...)
		clock := newTestClock()
		v := newVerifier(t, auth.Config{JWKSURL: srv.URL, HTTPClient: srv.Client(), Now: clock.Now}, nil)
		srv.fail.Store(true)
		start := clock.Now()
		before := srv.hits.Load()
		for range 50 {
			mustReject(t, v, floodToken(t, start), "unknown key id")
			clock.Advance(100 * time.Millisecond)
		}
		if got := srv.hits.Load() - before; got != 1 {
			t.Fatalf("JWKS fetches = %d, want 1", got)
		}
		// The keys loaded at startup keep verifying.
		mustAccept(t, v, sign(t, jwt.SigningMethodES256, keys().ec, kidEC, claimsAt(start)))
	})
}

// TestJWKSKeyFilter publishes one key at a time under kid "probe" next to the
// usual keys and signs a token with the matching private key. A key that
// must not verify leaves the kid unknown; a key that must verify accepts the
// token.
func TestJWKSKeyFilter(t *testing.T) {
	k := keys()
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	with := func(jwk map[string]any, edits map[string]any) map[string]any {
		out := maps.Clone(jwk)
		for key, val := range edits {
			if val == nil {
				delete(out, key)
			} else {
				out[key] = val
			}
		}
		return out
	}
	const probe = "probe"
	rsaKey, ecKey, edKey := rsaJWK(probe, k.rsaOther), ecJWK(probe, k.ec), edJWK(probe, k.ed)
	ecRaw, err := k.ec.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	ecD, err := k.ec.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	offCurveY := append([]byte(nil), ecRaw[33:]...)
	offCurveY[31] ^= 1
	p384Raw, err := p384.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	// A 4608-bit odd modulus: over go-jose's 4096-bit ceiling.
	bigN := new(big.Int).Lsh(big.NewInt(1), 4607)
	bigN.Or(bigN, big.NewInt(1))
	paddedN := b64(k.rsaOther.N.Bytes())
	paddedN += strings.Repeat("=", (4-len(paddedN)%4)%4)
	if !strings.HasSuffix(paddedN, "=") {
		t.Fatal("test setup: the padded modulus has no padding")
	}

	// x5c: a self-signed certificate for the probe key, and one for another key.
	selfSigned := func(priv *rsa.PrivateKey) string {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "han test"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
		if err != nil {
			t.Fatal(err)
		}
		return base64.StdEncoding.EncodeToString(der)
	}
	ownCert, otherCert := selfSigned(k.rsaOther), selfSigned(k.rsa)

	rsaSigned := sign(t, jwt.SigningMethodRS256, k.rsaOther, probe, claimsAt(time.Now()))
	ecSigned := sign(t, jwt.SigningMethodES256, k.ec, probe, claimsAt(time.Now()))
	edSigned := sign(t, jwt.SigningMethodEdDSA, k.ed, probe, claimsAt(time.Now()))

	// What a case expects of its key.
	const (
		usable  = iota
		skipped // not loaded
		private // a valid private key, not loaded for being private
	)
	for _, tc := range []struct {
		name  string
		jwk   map[string]any
		token string
		want  int
	}{
		{"RSA public key", rsaKey, rsaSigned, usable},
		{"RSA with key_ops verify", with(rsaKey, map[string]any{"key_ops": []string{"verify"}}), rsaSigned, usable},
		{"RSA without use and alg", with(rsaKey, map[string]any{"use": nil, "alg": nil}), rsaSigned, usable},
		{"RSA with its certificate in x5c", with(rsaKey, map[string]any{"x5c": []string{ownCert}}), rsaSigned, usable},
		{"RSA with another key's certificate in x5c", with(rsaKey, map[string]any{"x5c": []string{otherCert}}), rsaSigned, skipped},
		{"RSA for encryption", with(rsaKey, map[string]any{"use": "enc"}), rsaSigned, skipped},
		{"RSA with key_ops encrypt", with(rsaKey, map[string]any{"key_ops": []string{"encrypt"}}), rsaSigned, skipped},
		{"RSA pinned to PS256", with(rsaKey, map[string]any{"alg": "PS256"}), rsaSigned, skipped},
		{"RSA 1024-bit modulus", rsaJWK(probe, small), sign(t, jwt.SigningMethodRS256, small, probe, claimsAt(time.Now())), skipped},
		{"RSA modulus over 4096 bits", with(rsaKey, map[string]any{"n": b64(bigN.Bytes())}), rsaSigned, skipped},
		{"RSA even exponent", with(rsaKey, map[string]any{"e": b64(big.NewInt(65536).Bytes())}), rsaSigned, skipped},
		{"RSA padded base64", with(rsaKey, map[string]any{"n": paddedN}), rsaSigned, skipped},
		{"RSA private key", with(rsaKey, map[string]any{
			"d": b64(k.rsaOther.D.Bytes()), "p": b64(k.rsaOther.Primes[0].Bytes()), "q": b64(k.rsaOther.Primes[1].Bytes()),
		}), rsaSigned, private},
		{"EC P-256 public key", ecKey, ecSigned, usable},
		{"EC point off the curve", with(ecKey, map[string]any{"y": b64(offCurveY)}), ecSigned, skipped},
		{"EC P-384 key", with(ecKey, map[string]any{"crv": "P-384", "x": b64(p384Raw[1:49]), "y": b64(p384Raw[49:])}), ecSigned, skipped},
		{"EC pinned to RS256", with(ecKey, map[string]any{"alg": "RS256"}), ecSigned, skipped},
		{"EC private key", with(ecKey, map[string]any{"d": b64(ecD)}), ecSigned, private},
		{"Ed25519 public key", edKey, edSigned, usable},
		{"Ed25519 private key", with(edKey, map[string]any{"d": b64(k.ed.Seed())}), edSigned, private},
		{"X25519 key", with(edKey, map[string]any{"crv": "X25519"}), edSigned, skipped},
		{"symmetric key", map[string]any{"kty": "oct", "kid": probe, "k": b64(devSecret)}, rsaSigned, skipped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == private {
				raw, err := json.Marshal(tc.jwk)
				if err != nil {
					t.Fatal(err)
				}
				var parsed jose.JSONWebKey
				if err := parsed.UnmarshalJSON(raw); err != nil || parsed.IsPublic() {
					t.Fatalf("test setup: the JWK is not a valid private key (err %v)", err)
				}
			}
			srv := newJWKSServer(t, append(baseJWKs(), tc.jwk)...)
			v := newVerifier(t, auth.Config{JWKSURL: srv.URL, HTTPClient: srv.Client()}, nil)
			_, err := v.Verify(context.Background(), tc.token)
			switch {
			case tc.want == usable && err != nil:
				t.Fatalf("Verify rejected a token of a usable key: %v", err)
			case tc.want == usable:
			case err == nil:
				t.Fatal("Verify accepted a token of a key that must be skipped")
			case !errors.Is(err, auth.ErrUnauthorized):
				t.Fatalf("error %v does not wrap ErrUnauthorized", err)
			case !strings.Contains(err.Error(), "unknown key id"):
				// Any other reason means the key was loaded and only the
				// signature check stopped the token.
				t.Fatalf("reason = %v, want unknown key id (the key must not be loaded)", err)
			}
		})
	}
}
