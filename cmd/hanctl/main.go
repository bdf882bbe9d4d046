// Command hanctl is the admin CLI of the HAN gateway: migrations, dev
// tokens, projects, demo data and the Redis ACL file.
//
//	hanctl migrate
//	hanctl token --sub UUID [--typ user|service] [--svc NAME] [--ttl 1h]
//	hanctl project create --name NAME [--id UUID] --member UUID:read|write|admin ...
//	hanctl project legacy-import --project UUID --file entries.json [--container-ttl 1h]
//	hanctl seed demo
//	hanctl redis acl [--separate-instances] [--out FILE]
//	hanctl redis cutover [--force]     (HAN_REDIS_ADMIN_URL)
//	hanctl redis verify                (HAN_REDIS_ADMIN_URL)
//	hanctl sizing [--identities N ...] [--sample]
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "hanctl:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  hanctl migrate
  hanctl token --sub UUID [--typ user|service] [--svc NAME] [--ttl 1h]
  hanctl project create --name NAME [--id UUID] --member UUID:read|write|admin [--member ...]
  hanctl project legacy-import --project UUID --file entries.json [--container-ttl 1h]
  hanctl seed demo
  hanctl redis acl [--separate-instances] [--out FILE]
  hanctl redis cutover [--force]   (HAN_REDIS_ADMIN_URL; removes the legacy DB2 stub)
  hanctl redis verify              (HAN_REDIS_ADMIN_URL; no stub left, TTL rules hold)
  hanctl sizing [--identities N ...] [--sample]`

// Run executes one hanctl command; tests call it directly.
func Run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
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
	case "help", "-h", "--help":
		fmt.Fprintln(out, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}
