package auth_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/han-app/gateway/internal/auth"
)

// A token verified once is answered from the cache afterwards, with the same
// principal; the cache never keeps a token alive past its exp plus the
// leeway, nor past a key-set change, and never accepts a token that differs
// in one byte.
func TestVerifiedTokenCache(t *testing.T) {
	clock := newTestClock()
	v := newVerifier(t, auth.Config{DevHS256Secret: devSecret, Issuer: testIssuer, Audience: testAudience, Now: clock.Now, Leeway: 5 * time.Second}, nil)
	now := clock.Now()
	token := sign(t, jwt.SigningMethodHS256, devSecret, "", claimsAt(now, set("exp", now.Add(2*time.Minute).Unix())))

	first := mustAccept(t, v, token)
	hits := v.VerifiedHits()
	second := mustAccept(t, v, token)
	if second != first {
		t.Fatalf("cached principal %+v differs from the verified one %+v", second, first)
	}
	if v.VerifiedHits() != hits+1 {
		t.Fatalf("the second Verify of one token was not answered from the cache (hits %d → %d)", hits, v.VerifiedHits())
	}

	t.Run("a token one byte off is verified in full and refused", func(t *testing.T) {
		i := strings.LastIndexByte(token, '.') + 5 // inside the signature
		c := byte('A')
		if token[i] == 'A' {
			c = 'B'
		}
		forged := token[:i] + string(c) + token[i+1:]
		mustReject(t, v, forged, "")
	})
	t.Run("re-verified after a minute, still accepted", func(t *testing.T) {
		clock.Advance(61 * time.Second)
		before := v.VerifiedHits()
		mustAccept(t, v, token)
		if v.VerifiedHits() != before {
			t.Fatal("a verification older than a minute was reused")
		}
	})
	t.Run("past exp plus leeway the cached token is refused", func(t *testing.T) {
		mustAccept(t, v, token) // cached again, exp is 59 s away
		clock.Advance(59*time.Second + 6*time.Second)
		mustReject(t, v, token, "expired")
	})
}

// Tokens verified concurrently by many goroutines stay correct (the race
// detector watches the cache).
func TestVerifiedTokenCacheConcurrent(t *testing.T) {
	v := newVerifier(t, auth.Config{DevHS256Secret: devSecret, Issuer: testIssuer, Audience: testAudience}, nil)
	now := time.Now()
	tokens := make([]string, 16)
	for i := range tokens {
		tokens[i] = sign(t, jwt.SigningMethodHS256, devSecret, "", claimsAt(now, set("jti", randomKID("c"))))
	}
	done := make(chan error, 64)
	for g := range 64 {
		go func() {
			var err error
			for i := range 200 {
				if _, e := v.Verify(context.Background(), tokens[(g+i)%len(tokens)]); e != nil {
					err = e
				}
			}
			done <- err
		}()
	}
	for range 64 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
