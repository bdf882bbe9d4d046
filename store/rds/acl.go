package rds

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// APIBackendUser is the Redis ACL user the service connects as.
const APIBackendUser = "api_backend"

// LegacyStubUser is the ACL user of the legacy DB2 safety stub (removed by cutover).
const LegacyStubUser = "legacy_stub"

// APIBackendKeyPatterns are the key patterns api_backend may touch
// (docs/redis-keys.md).
var APIBackendKeyPatterns = []string{"han:api:*", "han:rt:*", "han:coord:*", "han:settings:*", "han:prj:*"}

// APIBackendChannelPatterns are the Pub/Sub channels api_backend may use.
var APIBackendChannelPatterns = []string{"han:rt:*"}

// ClusterCommands are the subcommands a Redis Cluster client needs beyond
// what api_backend has on a standalone server: go-redis's ClusterClient
// reads the slot map with CLUSTER SLOTS, newer clients with CLUSTER SHARDS
// (Redis 7). Both are in neither @read nor @write.
var ClusterCommands = []string{"cluster|slots", "cluster|shards"}

// ACLOptions describes one rendered ACL file.
type ACLOptions struct {
	// APIBackendPassword is stored as a SHA-256 digest, never in clear text.
	APIBackendPassword string
	// SeparateInstances is true when DB0 and DB1 live on different Redis
	// instances; then SELECT is denied (the application never issues it; the
	// database comes only from the URL). Zero value: one shared instance, and
	// the client's handshake SELECT for DB1 is allowed.
	SeparateInstances bool
	// Cluster renders the ACL of a Redis Cluster node: api_backend may also
	// read the cluster's topology (ClusterCommands), and SELECT is denied,
	// since a cluster has only database 0. The same file is loaded on every
	// node. Zero value: a standalone server.
	Cluster bool
	// LegacyStubPassword, when set, adds the legacy_stub user (han:stub:*).
	LegacyStubPassword string
	// AdminUser, when set, adds an administrator of that name with every
	// command, key and channel (AdminRule): the operator's user for ACL
	// LOAD, CONFIG, the hanctl admin commands and a replica's masteruser.
	// AdminPassword is stored as a SHA-256 digest, never in clear text.
	AdminUser, AdminPassword string
	// Extra lines appended verbatim (the test harness adds its admin user;
	// hanctl the lines of the users it does not render, kept from the file
	// it replaces).
	Extra []string
}

// OwnedUsers are the users RenderACL renders from its options: a file it
// replaces keeps its other users only if they are passed back as Extra.
// legacy_stub is one of them even when not rendered.
func (o ACLOptions) OwnedUsers() []string {
	u := []string{"default", APIBackendUser, LegacyStubUser}
	if o.AdminUser != "" {
		u = append(u, o.AdminUser)
	}
	return u
}

// RenderACL renders an ACL file for redis-server's aclfile directive. The
// default user is disabled; api_backend gets only the prefixes and command
// categories the service needs.
func RenderACL(o ACLOptions) string {
	var b strings.Builder
	// The default user stays off (no connection can authenticate as it),
	// but it keeps full permissions: redis-server replays the AOF as the
	// default user and re-checks ACLs at each EXEC, so a permissionless
	// default user silently drops every Lua script's effects (written as
	// MULTI/EXEC) on restart — redis/redis#14541, fixed upstream in late 2025
	// (redis/redis#14545). TestRestartWithAOFKeepsIdempotencyAndProjectKeys
	// guards this.
	b.WriteString("user default off ~* &* +@all\n")
	b.WriteString(APIBackendRule(o.APIBackendPassword, o.SeparateInstances || o.Cluster))
	if o.Cluster {
		for _, c := range ClusterCommands {
			b.WriteString(" +" + c)
		}
	}
	b.WriteByte('\n')
	if o.LegacyStubPassword != "" {
		fmt.Fprintf(&b, "user %s on #%s resetkeys resetchannels ~han:stub:* -@all +@read +@write +@scripting +@connection -@dangerous +time%s\n",
			LegacyStubUser, passwordDigest(o.LegacyStubPassword), ServerScriptDenials)
	}
	if o.AdminUser != "" {
		b.WriteString(AdminRule(o.AdminUser, o.AdminPassword) + "\n")
	}
	for _, l := range o.Extra {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// ServerScriptDenials takes from @scripting what acts on the whole server
// rather than on the service's own keys, and is not in @dangerous: SCRIPT
// DEBUG (SYNC freezes every client of the server inside a debugger; YES
// forks it for every script), SCRIPT FLUSH and KILL (every client's script
// cache, another application's running script), and the FUNCTION commands
// that change or stop other applications' libraries. The service runs its
// own scripts with EVALSHA and EVAL alone.
const ServerScriptDenials = " -script|debug -script|flush -script|kill" +
	" -function|flush -function|delete -function|load -function|restore -function|kill"

// APIBackendRule renders the single ACL rule line for api_backend.
func APIBackendRule(password string, separateInstances bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "user %s on #%s resetkeys resetchannels", APIBackendUser, passwordDigest(password))
	for _, p := range APIBackendKeyPatterns {
		b.WriteString(" ~" + p)
	}
	for _, p := range APIBackendChannelPatterns {
		b.WriteString(" &" + p)
	}
	// TIME is only in @fast and INFO is @dangerous: every script reads the
	// clock, and the eviction-policy gate reads INFO memory.
	b.WriteString(" -@all +@read +@write +@scripting +@pubsub +@connection -@dangerous +time +info" + ServerScriptDenials)
	if separateInstances {
		b.WriteString(" -select")
	}
	return b.String()
}

// AdminRule renders the ACL rule line of an administrator: every command,
// key and channel.
func AdminRule(name, password string) string {
	return fmt.Sprintf("user %s on #%s ~* &* +@all", name, passwordDigest(password))
}

// ACLFileUser is one user line of an ACL file.
type ACLFileUser struct {
	Name string
	Line string // the whole line, as in the file
}

// ParseACLFile lists the users of an ACL file in their order. Every line
// that is not blank must be a user line ("user NAME rules…"), as
// redis-server requires; the error names the first that is not by its
// number only (a line may hold a password).
func ParseACLFile(text string) ([]ACLFileUser, error) {
	var users []ACLFileUser
	for i, l := range strings.Split(text, "\n") {
		l = strings.TrimRight(l, "\r")
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if len(f) < 2 || f[0] != "user" {
			return nil, fmt.Errorf("line %d is not a user line", i+1)
		}
		users = append(users, ACLFileUser{Name: f[1], Line: strings.TrimSpace(l)})
	}
	return users, nil
}

func passwordDigest(p string) string {
	sum := sha256.Sum256([]byte(p))
	return hex.EncodeToString(sum[:])
}
