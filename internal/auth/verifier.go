package auth

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/redis/go-redis/v9"
	segjson "github.com/segmentio/encoding/json"
)

// Config configures a Verifier. Exactly one key source must exist: a JWKS
// (JWKSURL or JWKSFile, not both) and/or, outside prod, DevHS256Secret.
type Config struct {
	// Issuer and Audience are checked only when non-empty.
	Issuer, Audience string
	// JWKSURL is a JWKS served over HTTP(S); in prod it must be https. A
	// fetch from an https URL follows redirects only to https URLs.
	JWKSURL string
	// JWKSFile is a JWKS on disk, re-read on every refetch.
	JWKSFile string
	// DevHS256Secret enables HS256 (dev only; at least 32 bytes, the key
	// size RFC 7518 requires for HS256). Zero value: HS256 is rejected.
	DevHS256Secret []byte
	// Env is the environment name; "prod" (or "production", any case)
	// makes NewVerifier refuse DevHS256Secret and a non-https JWKSURL.
	Env string
	// Leeway is the clock skew allowed on exp, nbf and iat. Zero value
	// means 30s.
	Leeway time.Duration
	// RefetchInterval bounds refetches caused by an unknown kid to one per
	// kid per interval, on top of the fixed limit of one refetch per 10s
	// for all kids together. Zero value means 30s.
	RefetchInterval time.Duration
	// NegativeTTL is how long the Redis marker of a kid that is still
	// unknown after a refetch lives. Zero value means 30s.
	NegativeTTL time.Duration
	// Redis is DB0, holding han:api:jwks:negative:<kid_hash>. Zero value:
	// the negative cache is local to this Verifier.
	Redis redis.UniversalClient
	// HTTPClient fetches JWKSURL; each fetch uses a copy whose redirect
	// policy also refuses a hop from https to another scheme. Zero value:
	// a client with a 5s timeout.
	HTTPClient *http.Client
	// Now is the clock (tests). Zero value: time.Now.
	Now func() time.Time
}

const (
	defaultInterval     = 30 * time.Second
	defaultHTTPTimeout  = 5 * time.Second
	minHS256SecretBytes = 32
	// maxTokenBytes keeps a hostile header from costing a large decode.
	maxTokenBytes = 8 << 10
	// maxKIDBytes: a longer kid is rejected as unknown without a refetch.
	maxKIDBytes = 256
	// maxTrackedKIDs bounds the per-kid refetch map.
	maxTrackedKIDs = 1024
	// sourceRefetchGap is the least time between the starts of two JWKS
	// refetches by one Verifier, whichever kids cause them: random kids in
	// unauthenticated tokens must not turn into a stream of fetches, and a
	// key published by a rotation is still found within this long of its
	// first use.
	sourceRefetchGap = 10 * time.Second
	// missTimeout bounds one shared unknown-kid resolution (Redis + fetch),
	// which runs detached from the request that started it.
	missTimeout = 10 * time.Second
	// redisTimeout bounds each negative-cache round trip: the marker is an
	// optimisation and must not stall authentication.
	redisTimeout = 500 * time.Millisecond

	negativeKeyPrefix = "han:api:jwks:negative:"
	levelDebug        = slog.LevelDebug
)

// Verifier verifies bearer tokens. Create it with NewVerifier.
type Verifier struct {
	cfg     Config
	logger  *slog.Logger
	parser  *jwt.Parser
	secret  []byte // nil unless HS256 is enabled
	useJWKS bool

	keys     atomic.Pointer[keySet]
	verified verifiedCache

	// life ends at Close; it cancels a resolution in progress.
	life      context.Context
	endLife   context.CancelFunc
	resolving sync.WaitGroup // the unknown-kid resolutions running detached

	mu           sync.Mutex           // guards the fields below
	closed       bool                 // Close was called: no resolution starts
	noFetchUntil map[string]time.Time // kid → no refetch (or marker read) for it before then
	inflight     map[string]*kidMiss  // kid → the resolution concurrent misses share
	fetch        *fetchCall           // the newest JWKS refetch, running or finished; nil before the first
	fetchGen     uint64               // number of JWKS refetches started
	nextFetch    time.Time            // no JWKS refetch starts before then
	lastFullWarn time.Time            // last "too many unknown kids" warning
}

type kidMiss struct {
	done chan struct{}
}

// NewVerifier validates cfg, fills its defaults and loads the JWKS once. It
// fails when the JWKS cannot be loaded at all or when no usable key exists
// ([ErrNoKeys]), so a misconfigured instance never starts rejecting every
// request. A nil logger discards logs.
func NewVerifier(ctx context.Context, cfg Config, logger *slog.Logger) (*Verifier, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	useJWKS := cfg.JWKSURL != "" || cfg.JWKSFile != ""
	cfg = cfg.withDefaults()
	v := &Verifier{
		cfg:          cfg,
		logger:       logger,
		useJWKS:      useJWKS,
		noFetchUntil: make(map[string]time.Time),
		inflight:     make(map[string]*kidMiss),
	}
	v.life, v.endLife = context.WithCancel(context.Background())
	if len(cfg.DevHS256Secret) > 0 {
		// A private copy: the caller's slice may be reused or zeroed.
		v.secret = append([]byte(nil), cfg.DevHS256Secret...)
		v.cfg.DevHS256Secret = nil
	}
	if useJWKS {
		ks, err := v.loadJWKS(ctx)
		if err != nil {
			return nil, fmt.Errorf("auth: load jwks: %w", err)
		}
		if ks.n == 0 && v.secret == nil {
			return nil, fmt.Errorf("auth: jwks holds no usable key: %w", ErrNoKeys)
		}
		v.keys.Store(ks)
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(v.acceptedAlgs()),
		jwt.WithLeeway(cfg.Leeway),
		jwt.WithTimeFunc(cfg.Now),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithStrictDecoding(),
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// Close cancels an unknown-kid resolution in progress (its refetch fails and
// the keys stay as they are) and waits for it to end. Verify keeps working
// with the keys already loaded, but an unknown kid is rejected from then on
// without a fetch. Call it after the last request that may verify a token,
// before closing the Redis client. Idempotent.
func (v *Verifier) Close() {
	v.mu.Lock()
	v.closed = true
	v.mu.Unlock()
	v.endLife()
	v.resolving.Wait()
}

// Leeway is the clock skew allowed on exp, nbf and iat: a token is accepted
// until exp plus Leeway. REST requests and WebSocket connections share it,
// so a socket ends when the same token would stop working over REST.
func (v *Verifier) Leeway() time.Duration { return v.cfg.Leeway }

func (v *Verifier) acceptedAlgs() []string {
	var algs []string
	if v.useJWKS {
		algs = append(algs, algRS256, algES256, algEdDSA)
	}
	if v.secret != nil {
		algs = append(algs, algHS256)
	}
	return algs
}

func (v *Verifier) algAccepted(alg string) bool {
	switch alg {
	case algRS256, algES256, algEdDSA:
		return v.useJWKS
	case algHS256:
		return v.secret != nil
	}
	return false
}

// claims is the token body Verify understands. The three times shadow the
// embedded ones (a field of claims itself wins over a promoted field of the
// same JSON name), so that their common form, whole seconds, is read
// without a decoder of its own (numericDate).
type claims struct {
	jwt.RegisteredClaims
	ExpiresAt *numericDate `json:"exp,omitempty"`
	NotBefore *numericDate `json:"nbf,omitempty"`
	IssuedAt  *numericDate `json:"iat,omitempty"`
	Typ       *string      `json:"typ,omitempty"`
	Svc       string       `json:"svc,omitempty"`
}

// GetExpirationTime, GetNotBefore and GetIssuedAt give the parser's
// validation the times read into claims' own fields.
func (c claims) GetExpirationTime() (*jwt.NumericDate, error) { return c.ExpiresAt.date(), nil }
func (c claims) GetNotBefore() (*jwt.NumericDate, error)      { return c.NotBefore.date(), nil }
func (c claims) GetIssuedAt() (*jwt.NumericDate, error)       { return c.IssuedAt.date(), nil }

// numericDate is a JWT time claim, read as jwt.NumericDate reads it. A
// plain integer of at most 15 digits (whole seconds; every real exp, iat
// and nbf) is converted here; anything else goes to jwt.NumericDate's own
// decoding, which decodes the number once more with encoding/json and
// took ≈ 2 % of the gateway's CPU in a connect storm. The two agree on
// every input: such an integer is exact as the float64 jwt converts it to.
type numericDate struct{ jwt.NumericDate }

func (d *numericDate) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || len(b) > 15 || (b[0] == '0' && len(b) > 1) {
		return d.NumericDate.UnmarshalJSON(b)
	}
	var n int64
	for _, ch := range b {
		if ch < '0' || ch > '9' {
			return d.NumericDate.UnmarshalJSON(b)
		}
		n = n*10 + int64(ch-'0')
	}
	d.NumericDate = *jwt.NewNumericDate(time.Unix(n, 0))
	return nil
}

// date is d as the parser's validation takes it (nil when absent).
func (d *numericDate) date() *jwt.NumericDate {
	if d == nil {
		return nil
	}
	return &d.NumericDate
}

// UnmarshalJSON reads each claim under its exact name only. Claim names are
// case-sensitive, but encoding/json matches struct fields case-insensitively:
// a custom "TYP", "SUB" or "EXP" that an identity provider copies into its
// tokens would be taken for typ, sub or exp, decide the principal, or stand
// in for a missing exp. Decoded here, such names are unknown claims and
// ignored like any other, so a token without the real exp is refused. The
// decoder is segmentio's, whose exact-name mode costs no more than the
// standard decoding on the connect path.
func (c *claims) UnmarshalJSON(data []byte) error {
	type exactNames claims // the same fields, without this method
	rest, err := segjson.Parse(data, (*exactNames)(c), segjson.DontMatchCaseInsensitiveStructFields)
	if err == nil && len(bytes.TrimSpace(rest)) > 0 {
		err = errors.New("data after the claims object")
	}
	return err
}

// Reasons wrapped next to ErrUnauthorized; fixed text, never token content.
var (
	errNoToken     = errors.New("no token")
	errMalformed   = errors.New("malformed token")
	errAlg         = errors.New("signing algorithm not accepted")
	errKeyMismatch = errors.New("key type does not match alg")
	errUnknownKID  = errors.New("unknown key id")
	errCrit        = errors.New("unsupported crit header")
	errSub         = errors.New("sub claim missing or not a UUID")
	errTyp         = errors.New("unknown typ claim")
	errSvc         = errors.New("invalid svc claim")
)

// jwtReasons are the golang-jwt sentinels Verify passes on (fixed text).
var jwtReasons = []error{
	jwt.ErrTokenMalformed,
	jwt.ErrTokenSignatureInvalid,
	jwt.ErrTokenExpired,
	jwt.ErrTokenNotValidYet,
	jwt.ErrTokenUsedBeforeIssued,
	jwt.ErrTokenInvalidIssuer,
	jwt.ErrTokenInvalidAudience,
	jwt.ErrTokenRequiredClaimMissing,
	jwt.ErrTokenInvalidClaims,
	jwt.ErrTokenUnverifiable,
}

// Verify checks token and returns the Principal it proves. Every failure
// wraps ErrUnauthorized.
func (v *Verifier) Verify(ctx context.Context, token string) (Principal, error) {
	if token == "" {
		return Principal{}, v.reject(ctx, errNoToken)
	}
	if len(token) > maxTokenBytes {
		return Principal{}, v.reject(ctx, errMalformed)
	}
	keys := v.keys.Load()
	if p, ok := v.verified.get(token, keys, v.cfg.Now()); ok {
		return p, nil
	}
	p, err := v.verify(ctx, token)
	if err == nil {
		v.verified.put(token, p, keys, v.cfg.Now(), v.cfg.Leeway)
	}
	return p, err
}

// verify is the full verification of a token: signature, claims, subject
// and kind.
func (v *Verifier) verify(ctx context.Context, token string) (Principal, error) {
	var c claims
	tok, err := v.parser.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		return v.keyFor(ctx, t)
	})
	if err != nil {
		return Principal{}, v.reject(ctx, v.classify(tok, err))
	}
	sub, ok := canonicalUUID(c.Subject)
	if !ok {
		return Principal{}, v.reject(ctx, errSub)
	}
	p := Principal{UserID: sub, Kind: KindUser}
	if c.ExpiresAt != nil { // always set: the parser requires exp
		p.Expires = c.ExpiresAt.Time
	}
	if c.Typ != nil {
		switch Kind(*c.Typ) {
		case KindUser:
		case KindService:
			p.Kind = KindService
			if c.Svc != "" {
				if !validService(c.Svc) {
					return Principal{}, v.reject(ctx, errSvc)
				}
				p.Service = c.Svc
			}
		default:
			return Principal{}, v.reject(ctx, errTyp)
		}
	}
	return p, nil
}

// keyFor is the jwt.Keyfunc: it runs after the header and claims decoded and
// before the signature is checked, and returns only a key whose type matches
// the token's alg.
func (v *Verifier) keyFor(ctx context.Context, t *jwt.Token) (any, error) {
	if _, ok := t.Header["crit"]; ok {
		return nil, errCrit
	}
	alg := t.Method.Alg()
	if !v.algAccepted(alg) {
		return nil, errAlg
	}
	if alg == algHS256 {
		return v.secret, nil
	}
	kid := ""
	if raw, ok := t.Header["kid"]; ok {
		s, isString := raw.(string)
		if !isString {
			return nil, errMalformed
		}
		kid = s
	}
	key, known := v.keys.Load().lookup(kid, alg)
	if key != nil {
		return key, nil
	}
	if known {
		return nil, errKeyMismatch
	}
	v.resolveMiss(ctx, kid)
	key, known = v.keys.Load().lookup(kid, alg)
	switch {
	case key != nil:
		return key, nil
	case known:
		return nil, errKeyMismatch
	}
	return nil, errUnknownKID
}

// classify picks the reason wrapped next to ErrUnauthorized.
func (v *Verifier) classify(tok *jwt.Token, err error) error {
	for _, r := range []error{errCrit, errAlg, errKeyMismatch, errUnknownKID, errMalformed} {
		if errors.Is(err, r) {
			return r
		}
	}
	if errors.Is(err, jwt.ErrTokenMalformed) {
		return jwt.ErrTokenMalformed
	}
	// alg=none and other refused algs fail WithValidMethods before keyFor
	// runs; an alg golang-jwt does not know leaves Method nil.
	if tok != nil && (tok.Method == nil || !v.algAccepted(tok.Method.Alg())) {
		return errAlg
	}
	for _, r := range jwtReasons {
		if errors.Is(err, r) {
			return r
		}
	}
	return errMalformed
}

func (v *Verifier) reject(ctx context.Context, reason error) error {
	v.logger.LogAttrs(ctx, levelDebug, "auth: token rejected", slog.String("reason", reason.Error()))
	return fmt.Errorf("%w: %w", ErrUnauthorized, reason)
}

// checkConfig refuses a configuration that cannot verify safely: both key
// sources, negative durations, a dev secret in prod or too short, a JWKS URL
// that is not absolute http(s) (https in prod), or no key source at all.
func checkConfig(cfg Config) error {
	prod := strings.EqualFold(cfg.Env, "prod") || strings.EqualFold(cfg.Env, "production")
	switch {
	case cfg.JWKSURL != "" && cfg.JWKSFile != "":
		return errors.New("auth: set JWKSURL or JWKSFile, not both")
	case cfg.Leeway < 0 || cfg.RefetchInterval < 0 || cfg.NegativeTTL < 0:
		return errors.New("auth: negative duration in config")
	}
	if len(cfg.DevHS256Secret) > 0 {
		if prod {
			return errors.New("auth: the dev HS256 secret is refused in prod")
		}
		if len(cfg.DevHS256Secret) < minHS256SecretBytes {
			return fmt.Errorf("auth: the dev HS256 secret must be at least %d bytes", minHS256SecretBytes)
		}
	}
	if cfg.JWKSURL != "" {
		u, err := url.Parse(cfg.JWKSURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return errors.New("auth: JWKSURL must be an absolute http(s) URL")
		}
		if prod && u.Scheme != "https" {
			return errors.New("auth: JWKSURL must use https in prod")
		}
	}
	if cfg.JWKSURL == "" && cfg.JWKSFile == "" && len(cfg.DevHS256Secret) == 0 {
		return ErrNoKeys
	}
	return nil
}

// withDefaults fills the zero durations, HTTP client and clock.
func (c Config) withDefaults() Config {
	if c.Leeway == 0 {
		c.Leeway = defaultInterval
	}
	if c.RefetchInterval == 0 {
		c.RefetchInterval = defaultInterval
	}
	if c.NegativeTTL == 0 {
		c.NegativeTTL = defaultInterval
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: defaultHTTPTimeout}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
