package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"

	"github.com/go-jose/go-jose/v4"
)

const (
	algRS256 = "RS256"
	algES256 = "ES256"
	algEdDSA = "EdDSA"
	algHS256 = "HS256"

	maxJWKSBytes   = 1 << 20
	minRSABits     = 2048
	maxRSAExponent = 1<<32 - 1
)

// keySet is an immutable snapshot of the usable JWKS keys, indexed by kid.
// One kid may name keys of different types (RFC 7517 allows it); the alg of
// a token picks among them.
type keySet struct {
	byKID map[string][]verifyKey
	n     int
}

type verifyKey struct {
	alg string // the only alg this key verifies: RS256, ES256 or EdDSA
	key any    // *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey
}

// lookup returns the key of kid usable with alg; known reports whether kid
// names any key at all, so a type mismatch is told apart from an unknown kid.
func (ks *keySet) lookup(kid, alg string) (key any, known bool) {
	if ks == nil {
		return nil, false
	}
	keys, known := ks.byKID[kid]
	for _, k := range keys {
		if k.alg == alg {
			return k.key, true
		}
	}
	return nil, known
}

func (ks *keySet) has(kid string) bool {
	if ks == nil {
		return false
	}
	_, ok := ks.byKID[kid]
	return ok
}

// parseJWKS builds a key set from a JWKS document. Keys that may not verify
// our tokens, or that go-jose cannot parse, are skipped (and counted), so one
// odd key does not take the others down; a document that is not a JWKS at all
// is an error.
func parseJWKS(data []byte) (*keySet, int, error) {
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, 0, errors.New("jwks is not valid JSON")
	}
	if doc.Keys == nil {
		return nil, 0, errors.New(`jwks has no "keys" array`)
	}
	ks := &keySet{byKID: make(map[string][]verifyKey, len(doc.Keys))}
	skipped := 0
	for _, raw := range doc.Keys {
		kid, vk, ok := parseJWK(raw)
		if !ok {
			skipped++
			continue
		}
		existing := ks.byKID[kid]
		if slices.ContainsFunc(existing, func(e verifyKey) bool { return e.alg == vk.alg }) {
			// Two keys of one type under one kid would make the choice
			// arbitrary; the first one wins, the duplicate is ignored.
			skipped++
			continue
		}
		ks.byKID[kid] = append(existing, vk)
		ks.n++
	}
	return ks, skipped, nil
}

// parseJWK turns one JWKS member into a verification key. go-jose decodes
// the key material and checks it (EC points on their curve, coordinate
// lengths, Ed25519 low-order points, RSA moduli up to its 4096-bit limit);
// which keys may verify our tokens is decided here.
func parseJWK(raw json.RawMessage) (kid string, vk verifyKey, ok bool) {
	var usage struct {
		Use    string   `json:"use"`
		KeyOps []string `json:"key_ops"`
		Alg    string   `json:"alg"`
	}
	if err := json.Unmarshal(raw, &usage); err != nil {
		return "", verifyKey{}, false
	}
	if usage.Use != "" && usage.Use != "sig" {
		return "", verifyKey{}, false
	}
	if usage.KeyOps != nil && !slices.Contains(usage.KeyOps, "verify") {
		return "", verifyKey{}, false
	}
	var k jose.JSONWebKey
	if err := k.UnmarshalJSON(raw); err != nil {
		return "", verifyKey{}, false
	}
	switch pub := k.Key.(type) {
	case *rsa.PublicKey:
		if !usableRSA(pub) {
			return "", verifyKey{}, false
		}
		vk = verifyKey{alg: algRS256, key: pub}
	case *ecdsa.PublicKey:
		if pub.Curve != elliptic.P256() {
			return "", verifyKey{}, false
		}
		vk = verifyKey{alg: algES256, key: pub}
	case ed25519.PublicKey:
		vk = verifyKey{alg: algEdDSA, key: pub}
	default:
		// Symmetric keys, other key types, and private keys: a private key
		// in a published JWKS is compromised, since anyone who fetches the
		// document could sign tokens with it.
		return "", verifyKey{}, false
	}
	// A key pinned to another alg (RS384, PS256, ...) must not be used for
	// ours: that would be cross-algorithm use of one key.
	if usage.Alg != "" && usage.Alg != vk.alg {
		return "", verifyKey{}, false
	}
	return k.KeyID, vk, true
}

// usableRSA refuses moduli under 2048 bits, which are not trusted, and
// public exponents that are even, below 3 or wider than 32 bits.
func usableRSA(pub *rsa.PublicKey) bool {
	return pub.N.BitLen() >= minRSABits && pub.E >= 3 && pub.E%2 == 1 && uint64(pub.E) <= maxRSAExponent
}

// kidHash is how a kid appears in Redis key names and logs: the hex SHA-256,
// so attacker-chosen text never lands in either.
func kidHash(kid string) string {
	sum := sha256.Sum256([]byte(kid))
	return hex.EncodeToString(sum[:])
}

// loadJWKS reads the configured JWKS source once.
func (v *Verifier) loadJWKS(ctx context.Context) (*keySet, error) {
	var (
		data []byte
		err  error
	)
	if v.cfg.JWKSFile != "" {
		data, err = readJWKSFile(v.cfg.JWKSFile)
	} else {
		data, err = v.fetchJWKSURL(ctx)
	}
	if err != nil {
		return nil, err
	}
	ks, skipped, err := parseJWKS(data)
	if err != nil {
		return nil, err
	}
	if skipped > 0 {
		v.logger.LogAttrs(ctx, levelDebug, "auth: jwks keys skipped (unsupported or invalid)", slog.Int("skipped", skipped))
	}
	return ks, nil
}

func readJWKSFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open jwks file: %w", err)
	}
	defer f.Close()
	return readLimited(f)
}

func (v *Verifier) fetchJWKSURL(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.JWKSURL, nil)
	if err != nil {
		return nil, fmt.Errorf("build jwks request: %w", err)
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := httpsOnlyRedirects(v.cfg.HTTPClient).Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch jwks: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("fetch jwks: HTTP status %d", resp.StatusCode)
	}
	return readLimited(resp.Body)
}

// errRedirectDowngrade fails a JWKS fetch whose redirect leaves https.
var errRedirectDowngrade = errors.New("jwks redirect from https to another scheme refused")

// maxRedirects is the redirect limit of http.Client's default policy,
// kept for clients without their own.
const maxRedirects = 10

// httpsOnlyRedirects returns a copy of c whose redirect policy refuses any
// hop that leaves https once the request started on https; the hops it
// allows then go through c's own policy (or the default limit of 10). Whoever
// answers a plain-http request chooses the keys the Verifier trusts, so a
// redirect from the https JWKS URL (a misconfigured identity provider, CDN
// or proxy) must not hand that choice to the network; the refused fetch
// fails and the previous keys stay. The copy is made for every fetch, so
// no HTTPClient a caller passes can lift the rule, and c is left as it was.
func httpsOnlyRedirects(c *http.Client) *http.Client {
	guarded := *c
	next := c.CheckRedirect
	guarded.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if via[0].URL.Scheme == "https" && req.URL.Scheme != "https" {
			return errRedirectDowngrade
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		return nil
	}
	return &guarded
}

func readLimited(r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read jwks: %w", err)
	}
	if len(data) > maxJWKSBytes {
		return nil, fmt.Errorf("read jwks: document over %d bytes", maxJWKSBytes)
	}
	return data, nil
}
