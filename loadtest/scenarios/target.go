package scenarios

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/han-app/gateway/loadtest"
	"github.com/han-app/gateway/loadtest/baseline"
	"github.com/han-app/gateway/store/rds"
)

// Target keywords of --target besides a gateway URL.
const (
	// TargetBaseline starts `han-loadtest baseline-server` as a child
	// process: isolated like the gateway, so its memory can be measured.
	TargetBaseline = "baseline"
	// TargetBaselineInProcess serves the baseline inside the load
	// generator (quick smoke runs and tests; memory figures are mixed with
	// the generator's own).
	TargetBaselineInProcess = "baseline-inprocess"
	// baselineURLPrefix names an already running baseline server:
	// baseline:http://127.0.0.1:9090.
	baselineURLPrefix = "baseline:"
	// CentrifugoURLPrefix names a running Centrifugo v6 to compare with:
	// centrifugo:http://127.0.0.1:8000 (loadtest/centrifugo/config.json).
	CentrifugoURLPrefix = "centrifugo:"
	// DefaultTarget is the local stack's gateway.
	DefaultTarget = "http://127.0.0.1:8080"
)

// BaselineListenLine prefixes the line `han-loadtest baseline-server`
// prints once it serves; the rest of the line is its base URL.
const BaselineListenLine = "baseline-server: listening on "

// BaselineConfig configures every baseline the scenarios start (in-process
// or child). Tests set DropEvery to break delivery on purpose.
var BaselineConfig baseline.Config

// target is what a fan-out scenario loads.
type target struct {
	spec       string
	gateway    bool
	centrifugo bool
	base       string // http://host:port (the first of bases)
	// bases are the gateways a spread run loads (-target A,B): connection c
	// goes to bases[c mod len]. One entry for every other target.
	bases  []string
	inproc *baseline.Server
	child  *exec.Cmd
	stdin  io.Closer
}

// perConnFiles is how many descriptors one load connection costs in this
// process.
func (tg *target) perConnFiles() int {
	if tg.inproc != nil {
		return 2
	}
	return 1
}

func (tg *target) describe() string {
	switch {
	case tg.inproc != nil:
		return "baseline (in-process) " + tg.base
	case tg.child != nil:
		return "baseline (child process) " + tg.base
	case tg.centrifugo:
		return "centrifugo " + tg.base
	case !tg.gateway:
		return "baseline " + tg.base
	}
	if len(tg.bases) > 1 {
		return "gateways " + strings.Join(tg.bases, ",")
	}
	return "gateway " + tg.base
}

// baseOf is the gateway base URL that connection (or sender) i uses:
// round-robin over the targets.
func (tg *target) baseOf(i int) string {
	if len(tg.bases) < 2 {
		return tg.base
	}
	return tg.bases[i%len(tg.bases)]
}

// spread reports whether the run loads several gateways.
func (tg *target) spread() bool { return len(tg.bases) > 1 }

// openTargets resolves a -target that may list several gateways
// ("http://127.0.0.1:8080,http://127.0.0.1:8081"); a single entry is
// openTarget's.
func openTargets(ctx context.Context, raw string) (*target, error) {
	list, err := loadtest.SplitTargets(raw)
	if err != nil {
		return nil, err
	}
	if len(list) == 1 {
		return openTarget(ctx, list[0])
	}
	tg := &target{spec: raw, gateway: true}
	seen := map[string]bool{}
	for _, one := range list {
		t, err := openTarget(ctx, one)
		if err != nil {
			return nil, err
		}
		if !t.gateway {
			t.close()
			return nil, fmt.Errorf("target list %q: only gateway URLs can be listed, not %q", raw, one)
		}
		if seen[t.base] {
			return nil, fmt.Errorf("target list %q: %s is listed twice", raw, t.base)
		}
		seen[t.base] = true
		tg.bases = append(tg.bases, t.base)
	}
	tg.base = tg.bases[0]
	return tg, nil
}

// openTarget resolves --target: a loopback gateway URL, or a baseline.
// A list of targets is refused (scenarios that spread call openTargets).
func openTarget(ctx context.Context, spec string) (*target, error) {
	tg := &target{spec: spec}
	switch {
	case strings.Contains(spec, ","):
		return nil, fmt.Errorf("target %q: this scenario loads one target (chat-fanout, broadcast and idle-connections take a list)", spec)
	case spec == TargetBaselineInProcess:
		s := baseline.New(BaselineConfig, nil)
		if err := s.Start("127.0.0.1:0"); err != nil {
			return nil, err
		}
		tg.inproc, tg.base = s, s.URL()
	case spec == TargetBaseline:
		if err := tg.spawn(ctx); err != nil {
			return nil, err
		}
	case strings.HasPrefix(spec, baselineURLPrefix):
		u, err := loadtest.CheckLoopbackURL(strings.TrimPrefix(spec, baselineURLPrefix))
		if err != nil {
			return nil, err
		}
		tg.base = u.Scheme + "://" + u.Host
	case strings.HasPrefix(spec, CentrifugoURLPrefix):
		u, err := loadtest.CheckLoopbackURL(strings.TrimPrefix(spec, CentrifugoURLPrefix))
		if err != nil {
			return nil, err
		}
		if u.Scheme != "http" {
			return nil, fmt.Errorf("target %q: want %shttp://<loopback>:<port>", spec, CentrifugoURLPrefix)
		}
		tg.centrifugo, tg.base = true, u.Scheme+"://"+u.Host
	default:
		u, err := loadtest.CheckLoopbackURL(spec)
		if err != nil {
			return nil, err
		}
		if u.Scheme != "http" {
			return nil, fmt.Errorf("target %q: want http://<loopback>:<port>, %s, %s, %s<url> or %s<url>",
				spec, TargetBaseline, TargetBaselineInProcess, baselineURLPrefix, CentrifugoURLPrefix)
		}
		tg.gateway, tg.base = true, u.Scheme+"://"+u.Host
		tg.bases = []string{tg.base}
	}
	return tg, nil
}

// spawn starts this executable's baseline-server subcommand on a free
// loopback port. The child exits when its stdin closes, so it never
// outlives the load generator.
func (tg *target) spawn(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("start baseline: %w", err)
	}
	args := []string{"baseline-server", "-addr", "127.0.0.1:0", "-exit-on-stdin-eof"}
	if BaselineConfig.DropEvery > 0 {
		args = append(args, "-drop-every", fmt.Sprint(BaselineConfig.DropEvery))
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start baseline: %w", err)
	}
	tg.child, tg.stdin = cmd, stdin
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), BaselineListenLine); ok {
				lines <- u
				break
			}
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case u, ok := <-lines:
		if !ok {
			tg.close()
			return errors.New("start baseline: the child exited before listening")
		}
		tg.base = strings.TrimSpace(u)
	case <-time.After(15 * time.Second):
		tg.close()
		return errors.New("start baseline: no listening line within 15s")
	case <-ctx.Done():
		tg.close()
		return ctx.Err()
	}
	return nil
}

func (tg *target) close() {
	if tg.inproc != nil {
		_ = tg.inproc.Close()
	}
	if tg.child != nil {
		_ = tg.stdin.Close() // the child exits on stdin EOF
		done := make(chan struct{})
		go func() { _ = tg.child.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = tg.child.Process.Kill()
			<-done
		}
	}
}

// gatewayFlags are the settings scenarios that talk to the gateway (or to
// Centrifugo) share. Secrets default from the environment but are never
// flag defaults, so -h does not print them.
type gatewayFlags struct {
	devSecret string
	origin    string
	redisURL  string
	psMode    string // -pubsub-mode, parsed into pubsubMode by check
	auth      string
	tokenTTL  time.Duration
	getenv    func(string) string

	pubsubMode rds.PubSubMode

	cfSecret string // Centrifugo's HMAC secret for connection JWTs
	cfPrefix string // Centrifugo's Redis prefix
}

// Environment defaults of a Centrifugo target: the variables Centrifugo
// itself reads for the same settings.
const (
	envCentrifugoSecret   = "CENTRIFUGO_CLIENT_TOKEN_HMAC_SECRET_KEY"
	envCentrifugoRedisURL = "CENTRIFUGO_ENGINE_REDIS_ADDRESS"
	envCentrifugoPrefix   = "CENTRIFUGO_ENGINE_REDIS_PREFIX"
)

func (g *gatewayFlags) register(fs *flag.FlagSet, getenv func(string) string, needRedis bool) {
	g.getenv = getenv
	fs.StringVar(&g.devSecret, "dev-secret", "",
		"the gateway's dev HS256 secret, to mint user tokens (default: env HAN_JWT_DEV_HS256_SECRET)")
	origin, _, _ := strings.Cut(getenv("HAN_ALLOWED_ORIGINS"), ",")
	fs.StringVar(&g.origin, "origin", strings.TrimSpace(origin), "Origin header on WebSocket handshakes (env: first of HAN_ALLOWED_ORIGINS)")
	fs.StringVar(&g.auth, "auth", "bearer", "WebSocket auth: bearer (Authorization header) or ticket (POST /v1/realtime/tickets, needs -origin)")
	fs.DurationVar(&g.tokenTTL, "token-ttl", 2*time.Hour, "lifetime of the minted tokens")
	if needRedis {
		fs.StringVar(&g.redisURL, "redis-url", "",
			"Redis URL the broadcast publisher PUBLISHes to: the gateway's DB1 (default: env REDIS_REALTIME_URL), or Centrifugo's engine Redis (default: env "+envCentrifugoRedisURL+")")
		fs.StringVar(&g.psMode, "pubsub-mode", "",
			"how the broadcast publisher publishes, as the gateway's HAN_PUBSUB_MODE: auto (SPUBLISH on a cluster URL, PUBLISH otherwise), sharded or classic (default: env HAN_PUBSUB_MODE, else auto)")
	}
}

// registerCentrifugo adds the settings of a centrifugo: target.
func (g *gatewayFlags) registerCentrifugo(fs *flag.FlagSet) {
	fs.StringVar(&g.cfSecret, "centrifugo-secret", "",
		"Centrifugo's HMAC secret, to mint connection JWTs (default: env "+envCentrifugoSecret+")")
	fs.StringVar(&g.cfPrefix, "centrifugo-prefix", "",
		"Centrifugo's Redis prefix (default: env "+envCentrifugoPrefix+", else "+loadtest.CentrifugoRedisPrefix+")")
}

// checkCentrifugo fills the Centrifugo settings from the environment and
// checks them; the publisher's Redis URL defaults to Centrifugo's.
func (g *gatewayFlags) checkCentrifugo() error {
	env := func(k string) string {
		if g.getenv == nil {
			return ""
		}
		return g.getenv(k)
	}
	if g.cfSecret == "" {
		g.cfSecret = env(envCentrifugoSecret)
	}
	if g.cfPrefix == "" {
		g.cfPrefix = env(envCentrifugoPrefix)
	}
	if g.cfPrefix == "" {
		g.cfPrefix = loadtest.CentrifugoRedisPrefix
	}
	if g.redisURL == "" {
		g.redisURL = env(envCentrifugoRedisURL)
	}
	if len(g.cfSecret) < 32 {
		return errors.New("the centrifugo target needs -centrifugo-secret (or " + envCentrifugoSecret + "), at least 32 bytes")
	}
	return nil
}

// fromEnv fills unset secrets from the environment.
func (g *gatewayFlags) fromEnv() {
	if g.getenv == nil {
		return
	}
	if g.devSecret == "" {
		g.devSecret = g.getenv("HAN_JWT_DEV_HS256_SECRET")
	}
	if g.redisURL == "" {
		g.redisURL = g.getenv("REDIS_REALTIME_URL")
	}
	if g.psMode == "" {
		g.psMode = g.getenv("HAN_PUBSUB_MODE")
	}
}

func (g *gatewayFlags) check() error {
	g.fromEnv()
	var err error
	if g.pubsubMode, err = rds.ParsePubSubMode(g.psMode); err != nil {
		return fmt.Errorf("-pubsub-mode: %w", err)
	}
	if len(g.devSecret) < 32 {
		return errors.New("the gateway target needs -dev-secret (or HAN_JWT_DEV_HS256_SECRET), at least 32 bytes")
	}
	switch g.auth {
	case "bearer":
	case "ticket":
		if g.origin == "" {
			return errors.New("-auth ticket needs -origin (the gateway refuses a ticket without an allowed Origin)")
		}
	default:
		return fmt.Errorf("-auth %q: want bearer or ticket", g.auth)
	}
	return nil
}
