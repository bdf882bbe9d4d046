package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"slices"
	"strings"
)

const (
	algRS256 = "RS256"
	algES256 = "ES256"
	algEdDSA = "EdDSA"
	algHS256 = "HS256"

	maxJWKSBytes = 1 << 20
	// RSA keys below 2048 bits are not trusted; above 8192 bits a single
	// verification gets expensive enough to be a denial-of-service lever.
	minRSABits = 2048
	maxRSABits = 8192
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

// jwk is one member of a JWKS "keys" array (RFC 7517, RFC 7518 section 6, RFC 8037).
type jwk struct {
	Kty    string   `json:"kty"`
	Use    string   `json:"use"`
	KeyOps []string `json:"key_ops"`
	Alg    string   `json:"alg"`
	Kid    string   `json:"kid"`
	Crv    string   `json:"crv"`
	N      string   `json:"n"`
	E      string   `json:"e"`
	X      string   `json:"x"`
	Y      string   `json:"y"`
}

var errSkipKey = errors.New("key not usable")

// parseJWKS builds a key set from a JWKS document. Keys of unknown kty or
// crv, keys for another use, and keys that fail validation are skipped (and
// counted), so one odd key does not take the others down; a document that is
// not a JWKS at all is an error.
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
		var k jwk
		if err := json.Unmarshal(raw, &k); err != nil {
			skipped++
			continue
		}
		vk, err := k.verifyKey()
		if err != nil {
			skipped++
			continue
		}
		existing := ks.byKID[k.Kid]
		if slices.ContainsFunc(existing, func(e verifyKey) bool { return e.alg == vk.alg }) {
			// Two keys of one type under one kid would make the choice
			// arbitrary; the first one wins, the duplicate is ignored.
			skipped++
			continue
		}
		ks.byKID[k.Kid] = append(existing, vk)
		ks.n++
	}
	return ks, skipped, nil
}

func (k *jwk) verifyKey() (verifyKey, error) {
	if k.Use != "" && k.Use != "sig" {
		return verifyKey{}, errSkipKey
	}
	if k.KeyOps != nil && !slices.Contains(k.KeyOps, "verify") {
		return verifyKey{}, errSkipKey
	}
	var vk verifyKey
	switch k.Kty {
	case "RSA":
		pub, err := rsaKey(k.N, k.E)
		if err != nil {
			return verifyKey{}, err
		}
		vk = verifyKey{alg: algRS256, key: pub}
	case "EC":
		if k.Crv != "P-256" {
			return verifyKey{}, errSkipKey
		}
		pub, err := p256Key(k.X, k.Y)
		if err != nil {
			return verifyKey{}, err
		}
		vk = verifyKey{alg: algES256, key: pub}
	case "OKP":
		if k.Crv != "Ed25519" {
			return verifyKey{}, errSkipKey
		}
		x, err := b64(k.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			return verifyKey{}, errSkipKey
		}
		vk = verifyKey{alg: algEdDSA, key: ed25519.PublicKey(x)}
	default:
		return verifyKey{}, errSkipKey
	}
	// A key pinned to another alg (RS384, PS256, ...) must not be used for
	// ours: that would be cross-algorithm use of one key.
	if k.Alg != "" && k.Alg != vk.alg {
		return verifyKey{}, errSkipKey
	}
	return vk, nil
}

func rsaKey(nB64, eB64 string) (*rsa.PublicKey, error) {
	nb, err := b64(nB64)
	if err != nil {
		return nil, errSkipKey
	}
	eb, err := b64(eB64)
	if err != nil || len(eb) == 0 || len(eb) > 4 {
		return nil, errSkipKey
	}
	n := new(big.Int).SetBytes(nb)
	if n.BitLen() < minRSABits || n.BitLen() > maxRSABits {
		return nil, errSkipKey
	}
	e := 0
	for _, c := range eb {
		e = e<<8 | int(c)
	}
	if e < 3 || e%2 == 0 {
		return nil, errSkipKey
	}
	return &rsa.PublicKey{N: n, E: e}, nil
}

func p256Key(xB64, yB64 string) (*ecdsa.PublicKey, error) {
	x, err := b64(xB64)
	if err != nil || len(x) != 32 {
		return nil, errSkipKey
	}
	y, err := b64(yB64)
	if err != nil || len(y) != 32 {
		return nil, errSkipKey
	}
	point := make([]byte, 0, 65)
	point = append(point, 4)
	point = append(append(point, x...), y...)
	// Rejects points that are not on the curve (invalid-curve attacks).
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), point)
	if err != nil {
		return nil, errSkipKey
	}
	return pub, nil
}

// b64 decodes base64url; JWKs are unpadded, but padded input is tolerated.
func b64(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
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
	resp, err := v.cfg.HTTPClient.Do(req)
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
