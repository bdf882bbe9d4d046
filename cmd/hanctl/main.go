// Command hanctl is the admin CLI of the HAN gateway: migrations, dev
// tokens, projects, demo data and the Redis ACL file.
//
//	hanctl migrate [--timeout 5m]
//	hanctl token --sub UUID [--typ user|service] [--svc NAME] [--ttl 1h]
//	hanctl project create --name NAME [--id UUID [--update]] --member UUID:read|write|admin ... [--timeout 5m]
//	hanctl project legacy-import --project UUID --file entries.json [--container-ttl 1h] [--timeout 5m]
//	hanctl seed demo [--timeout 5m]
//	hanctl redis acl [--separate-instances] [--cluster] [--admin-user NAME] [--out FILE [--force]]
//	hanctl redis cutover [--force]     (HAN_REDIS_ADMIN_URL)
//	hanctl redis verify                (HAN_REDIS_ADMIN_URL)
//	hanctl sizing [--identities N ...] [--sample]
//
// hanctl COMMAND -h prints a command's flags and the environment variables
// it reads, and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// main stops the command on the first Ctrl-C (or SIGTERM), which ends its
// work and names the step it interrupted; a second one kills the process
// at once (the signal's default action, restored after the first).
func main() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		signal.Stop(sig)
		fmt.Fprintln(os.Stderr, "hanctl: interrupted, stopping (interrupt again to kill)")
		cancel()
	}()
	if err := Run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "hanctl:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  hanctl migrate [--timeout 5m]
  hanctl token --sub UUID [--typ user|service] [--svc NAME] [--ttl 1h]
  hanctl project create --name NAME [--id UUID [--update]] --member UUID:read|write|admin [--member ...] [--timeout 5m]
  hanctl project legacy-import --project UUID --file entries.json [--container-ttl 1h] [--timeout 5m]
  hanctl seed demo [--timeout 5m]
  hanctl redis acl [--separate-instances] [--cluster] [--admin-user NAME] [--out FILE [--force]]
  hanctl redis cutover [--force]   (HAN_REDIS_ADMIN_URL; removes the legacy DB2 stub)
  hanctl redis verify              (HAN_REDIS_ADMIN_URL; no stub left, TTL rules hold)
  hanctl sizing [--identities N ...] [--sample]
hanctl COMMAND -h shows a command's flags and the environment variables it reads.`

// Run executes one hanctl command; tests call it directly. -h or --help
// after a command prints its help to out and succeeds.
func Run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	err := dispatch(ctx, args, getenv, out)
	if errors.Is(err, errHelp) {
		return nil
	}
	return err
}

func dispatch(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("no command\n%s", usage)
	}
	switch args[0] {
	case "migrate":
		return cmdMigrate(ctx, args[1:], getenv, out)
	case "token":
		return cmdToken(args[1:], getenv, out)
	case "project":
		if len(args) > 1 && args[1] == "create" {
			return cmdProjectCreate(ctx, args[2:], getenv, out)
		}
		if len(args) > 1 && args[1] == "legacy-import" {
			return cmdLegacyImport(ctx, args[2:], getenv, out)
		}
	case "seed":
		if len(args) > 1 && args[1] == "demo" {
			return cmdSeedDemo(ctx, args[2:], getenv, out)
		}
	case "redis":
		if len(args) > 1 && args[1] == "acl" {
			return cmdRedisACL(args[2:], getenv, out)
		}
		if len(args) > 1 && args[1] == "cutover" {
			return cmdRedisCutover(ctx, args[2:], getenv, out)
		}
		if len(args) > 1 && args[1] == "verify" {
			return cmdRedisVerify(ctx, args[2:], getenv, out)
		}
	case "sizing":
		return cmdSizing(ctx, args[1:], getenv, out)
	case "help", "-h", "-help", "--help":
		fmt.Fprintln(out, usage)
		return nil
	}
	if len(args) > 1 && isHelp(args[1]) {
		// hanctl project -h: the group's commands.
		for _, l := range strings.Split(usage, "\n") {
			if strings.HasPrefix(l, "  hanctl "+args[0]+" ") {
				fmt.Fprintln(out, strings.TrimPrefix(l, "  "))
			}
		}
		fmt.Fprintf(out, "hanctl %s COMMAND -h shows a command's flags and environment variables\n", args[0])
		return errHelp
	}
	return fmt.Errorf("unknown command %q\n%s", strings.Join(args[:min(len(args), 2)], " "), usage)
}

func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" || a == "help" }

// errHelp: the help a command was asked for is printed; Run succeeds.
var errHelp = errors.New("help printed")

// commandHelp is what `hanctl COMMAND -h` prints above the flags: what the
// command does and the environment variables it reads. Keyed by the name
// of the command's FlagSet.
var commandHelp = map[string]struct{ about, env string }{
	"migrate": {"Applies the PostgreSQL migrations (idempotent).",
		"  DATABASE_URL              required unless HAN_DATABASE_DIRECT_URL is set\n" +
			"  HAN_DATABASE_DIRECT_URL   used instead of DATABASE_URL when set (PostgreSQL without a pooling proxy)\n" +
			"  HAN_DB_EXEC_MODE          how statements are sent (default cache_statement)"},
	"token": {"Prints a dev HS256 token for a user or service (not with HAN_ENV=prod).",
		"  HAN_JWT_DEV_HS256_SECRET  required, at least 32 bytes (the gateway's dev secret)\n" +
			"  HAN_ENV                   prod refuses dev tokens\n" +
			"  HAN_JWT_ISSUER, HAN_JWT_AUDIENCE  set the iss / aud claims when the gateway checks them"},
	"project create": {"Creates a project with its members; prints the project id. An --id a project already has is refused\n" +
		"(nothing changes) unless --update is given: then that project is renamed and the --member users get the roles given.",
		"  DATABASE_URL              required unless HAN_DATABASE_DIRECT_URL is set\n" +
			"  HAN_DATABASE_DIRECT_URL   used instead of DATABASE_URL when set (PostgreSQL without a pooling proxy)\n" +
			"  HAN_DB_EXEC_MODE          how statements are sent (default cache_statement)"},
	"project legacy-import": {"Writes cache entries in the legacy format into the cache container of a project that exists in PostgreSQL.",
		"  REDIS_URL                 required (Redis DB0)\n" +
			"  HAN_ENV                   required: the gateway's HAN_ENV (dev when it has none), the environment name in the keys\n" +
			"  DATABASE_URL              required unless HAN_DATABASE_DIRECT_URL is set: the project must exist there\n" +
			"  HAN_DATABASE_DIRECT_URL   used instead of DATABASE_URL when set (PostgreSQL without a pooling proxy)\n" +
			"  HAN_DB_EXEC_MODE          how statements are sent (default cache_statement)"},
	"seed demo": {"Migrates, creates the demo users, dialog and project; prints ids and tokens as JSON.",
		"  DATABASE_URL              required unless HAN_DATABASE_DIRECT_URL is set\n" +
			"  HAN_DATABASE_DIRECT_URL   used instead of DATABASE_URL when set (PostgreSQL without a pooling proxy)\n" +
			"  HAN_DB_EXEC_MODE          how statements are sent (default cache_statement)" + "\n" +
			"  HAN_JWT_DEV_HS256_SECRET  required, at least 32 bytes\n" +
			"  HAN_ENV                   prod refuses dev tokens\n" +
			"  HAN_JWT_ISSUER, HAN_JWT_AUDIENCE  set the iss / aud claims"},
	"redis acl": {"Renders the Redis ACL file: default (off), api_backend, legacy_stub and an admin user. With --out, the users of\n" +
		"FILE it does not render (an admin, a monitoring user) are kept as they are; dropping a user of FILE needs --force.",
		"  HAN_REDIS_API_PASSWORD    api_backend password (default: the password in REDIS_URL)\n" +
			"  REDIS_URL, REDIS_REALTIME_URL  two different servers: SELECT is denied;\n" +
			"                            a cluster URL (addr= seeds) implies --cluster\n" +
			"  HAN_LEGACY_STUB_PASSWORD  adds the legacy_stub user\n" +
			"  HAN_REDIS_ADMIN_PASSWORD  the --admin-user password (default: the password in HAN_REDIS_ADMIN_URL if its user is that NAME)"},
	"redis cutover": {"Removes the legacy DB2 safety stub: the legacy_stub ACL user (closing its connections), then its keys.",
		"  HAN_REDIS_ADMIN_URL       required: an admin connection to the Redis server"},
	"redis verify": {"Checks that no stub is left and every key carries its TTL.",
		"  HAN_REDIS_ADMIN_URL       required: an admin connection to the Redis server"},
	"sizing": {"Estimates Redis memory; --sample measures the live servers.",
		"  REDIS_URL, REDIS_REALTIME_URL  required with --sample"},
}

// parseFlags parses a command's flags. On -h/--help it prints the
// command's help to out and returns errHelp; a bad flag's message is only
// returned, so main prints it once, on stderr.
func parseFlags(fs *flag.FlagSet, args []string, out io.Writer) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if !errors.Is(err, flag.ErrHelp) {
		return err
	}
	h := commandHelp[fs.Name()]
	fmt.Fprintf(out, "usage: hanctl %s [flags]\n\n%s\n\nEnvironment:\n%s\n", fs.Name(), h.about, h.env)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(out, "\nFlags:")
		fs.SetOutput(out)
		fs.PrintDefaults()
	}
	return errHelp
}
