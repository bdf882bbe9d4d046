package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/config"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// openDB connects over HAN_DATABASE_DIRECT_URL when it is set, else
// DATABASE_URL: admin commands migrate and run long transactions, which
// belong on a connection straight to PostgreSQL, not one through a
// transaction-pooling proxy.
func openDB(ctx context.Context, getenv func(string) string) (*pgxpool.Pool, error) {
	name := "HAN_DATABASE_DIRECT_URL"
	u := getenv(name)
	if u == "" {
		name = "DATABASE_URL"
		u = getenv(name)
	}
	if u == "" {
		return nil, errors.New("DATABASE_URL (or HAN_DATABASE_DIRECT_URL) is required")
	}
	// The gateway's exec mode: behind a transaction pooler (DATABASE_URL
	// without HAN_DATABASE_DIRECT_URL) named prepared statements collide.
	mode, err := store.ParseExecMode(getenv("HAN_DB_EXEC_MODE"))
	if err != nil {
		return nil, fmt.Errorf("HAN_DB_EXEC_MODE: %w", err)
	}
	pool, err := store.OpenPG(ctx, u, store.PGConfig{MaxConns: 4, MinConns: 1, ExecMode: mode, URLName: name})
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, connectError(name, err)
	}
	return pool, nil
}

// refusals says in words what the SQLSTATEs a server most often refuses a
// connection with mean.
var refusals = map[string]string{
	"pg:3D000": "the database does not exist",
	"pg:28P01": "wrong password",
	"pg:28000": "the role does not exist or pg_hba.conf refuses it",
	"pg:53300": "too many connections",
	"pg:57P03": "the server is starting up or shutting down",
}

// connectError is a failed first connection over the URL in variable name:
// a server that answered and refused it (its SQLSTATE) or one not reached
// (the network error's kind). Never the error's text: pgx quotes the user,
// host and database, and a password written without percent-encoding ends
// up there.
func connectError(name string, err error) error {
	kind := store.Kind(err)
	if !strings.HasPrefix(kind, "pg:") {
		return fmt.Errorf("cannot reach PostgreSQL at %s (%s)", name, kind)
	}
	if why := refusals[kind]; why != "" {
		kind += ": " + why
	}
	return fmt.Errorf("PostgreSQL refused the connection over %s (%s)", name, kind)
}

// defaultDBTimeout is how long a PostgreSQL command (migrate, seed demo,
// project create) may take as a whole unless --timeout says otherwise:
// ample for the migrations, and a stalled server or a lock held by someone
// else ends in a clear failure instead of a wait without end (hanctl
// migrate runs before every start of the service).
const defaultDBTimeout = 5 * time.Minute

// closeWait is how long a command that ran out of time or was interrupted
// waits for its connections to close: pgx may spend up to 15 s trying to
// cancel a statement on a server that does not answer, and the process
// exits anyway.
const closeWait = 2 * time.Second

func timeoutFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("timeout", defaultDBTimeout,
		"give up when the command has not finished within this time (PostgreSQL stalled, a lock held); the step is named")
}

// errDBTimeout is the cause of a database command's context once its
// --timeout has passed.
var errDBTimeout = errors.New("--timeout passed")

// dbCommand is one command's PostgreSQL work: its pool and a context that
// ends at the command's --timeout (or at an interrupt).
type dbCommand struct {
	ctx     context.Context
	cancel  context.CancelFunc
	timeout time.Duration
	pool    *pgxpool.Pool
}

// startDBCommand connects (openDB) under the command's deadline.
func startDBCommand(ctx context.Context, timeout time.Duration, getenv func(string) string) (*dbCommand, error) {
	if timeout <= 0 {
		return nil, errors.New("--timeout must be positive")
	}
	c := &dbCommand{timeout: timeout}
	c.ctx, c.cancel = context.WithTimeoutCause(ctx, timeout, errDBTimeout)
	pool, err := openDB(c.ctx, getenv)
	if err := c.check("connect", err); err != nil {
		c.cancel()
		return nil, err
	}
	c.pool = pool
	return c, nil
}

// check names the step an error came from when the deadline or an
// interrupt cut it short; other errors pass unchanged.
func (c *dbCommand) check(step string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(context.Cause(c.ctx), errDBTimeout):
		return fmt.Errorf("%s: timed out: not done within --timeout %s (PostgreSQL stalled, or a lock held: see pg_stat_activity): %w",
			step, c.timeout, err)
	case c.ctx.Err() != nil:
		return fmt.Errorf("%s: interrupted: %w", step, err)
	}
	return err
}

// close closes the pool; after a timeout or an interrupt it waits at most
// closeWait for it.
func (c *dbCommand) close() {
	defer c.cancel()
	done := make(chan struct{})
	go func() {
		c.pool.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeWait):
	}
}

func cmdMigrate(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	timeout := timeoutFlag(fs)
	if err := parseFlags(fs, args, out); err != nil {
		return err
	}
	db, err := startDBCommand(ctx, *timeout, getenv)
	if err != nil {
		return err
	}
	defer db.close()
	applied, err := store.Migrate(db.ctx, db.pool)
	if err := db.check("apply migrations", err); err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintln(out, "migrations: up to date")
		return nil
	}
	fmt.Fprintln(out, "migrations applied:", strings.Join(applied, ", "))
	return nil
}

func devSecret(getenv func(string) string) ([]byte, error) {
	if config.IsProd(getenv("HAN_ENV")) {
		return nil, errors.New("dev tokens are refused when HAN_ENV=prod")
	}
	s := getenv("HAN_JWT_DEV_HS256_SECRET")
	if len(s) < 32 {
		return nil, errors.New("HAN_JWT_DEV_HS256_SECRET must be set (at least 32 bytes)")
	}
	return []byte(s), nil
}

func cmdToken(args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	sub := fs.String("sub", "", "subject (user id, UUID)")
	typ := fs.String("typ", "user", "token kind: user or service")
	svc := fs.String("svc", "", "service name (svc claim) for service tokens")
	ttl := fs.Duration("ttl", time.Hour, "lifetime")
	if err := parseFlags(fs, args, out); err != nil {
		return err
	}
	id, ok := ids.Canonical(*sub)
	if !ok {
		return errors.New("--sub must be a UUID")
	}
	if *typ != "user" && *typ != "service" {
		return errors.New("--typ must be user or service")
	}
	if *ttl <= 0 {
		return errors.New("--ttl must be positive")
	}
	secret, err := devSecret(getenv)
	if err != nil {
		return err
	}
	tok, err := auth.MintDevToken(secret, auth.DevClaims{Subject: id, Kind: auth.Kind(*typ), Service: *svc,
		Issuer: getenv("HAN_JWT_ISSUER"), Audience: getenv("HAN_JWT_AUDIENCE"), TTL: *ttl})
	if err != nil {
		return err
	}
	fmt.Fprintln(out, tok)
	return nil
}

func cmdProjectCreate(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("project create", flag.ContinueOnError)
	name := fs.String("name", "", "project name")
	idFlag := fs.String("id", "", "project id (UUID); default: a new one. An id a project already has is refused unless --update is given")
	update := fs.Bool("update", false, "with --id of an existing project: rename it to --name and set the roles of the --member users (other members keep theirs)")
	var members multi
	fs.Var(&members, "member", "UUID:read|write|admin (repeatable)")
	timeout := timeoutFlag(fs)
	if err := parseFlags(fs, args, out); err != nil {
		return err
	}
	if strings.TrimSpace(*name) == "" {
		return errors.New("--name is required")
	}
	id := ids.New()
	if *idFlag != "" {
		var ok bool
		if id, ok = ids.Canonical(*idFlag); !ok {
			return errors.New("--id must be a UUID")
		}
	} else if *update {
		return errors.New("--update needs the --id of the project to update")
	}
	var ms []store.ProjectMember
	for _, m := range members {
		u, role, _ := strings.Cut(m, ":")
		uid, ok := ids.Canonical(u)
		if !ok || (role != store.RoleRead && role != store.RoleWrite && role != store.RoleAdmin) {
			return fmt.Errorf("--member %q: want UUID:read|write|admin", m)
		}
		ms = append(ms, store.ProjectMember{UserID: uid, Role: role})
	}
	db, err := startDBCommand(ctx, *timeout, getenv)
	if err != nil {
		return err
	}
	defer db.close()
	create := store.New(db.pool).CreateNewProject
	if *update {
		create = store.New(db.pool).CreateProject
	}
	err = create(db.ctx, id, strings.TrimSpace(*name), ms)
	if errors.Is(err, store.ErrProjectExists) {
		return fmt.Errorf("project %s already exists: nothing changed (to rename it and set the roles of the --member users, add --update)", id)
	}
	if err := db.check("create project", err); err != nil {
		return err
	}
	fmt.Fprintln(out, id)
	return nil
}

// Fixed demo ids, so repeated seeding is idempotent and docs can name them.
const (
	demoAlice   = "00000000-0000-7000-8000-00000000a11c"
	demoBob     = "00000000-0000-7000-8000-000000000b0b"
	demoDialog  = "00000000-0000-7000-8000-0000000d1a10"
	demoProject = "00000000-0000-7000-8000-0000000070e0"
)

type demoOut struct {
	Users     map[string]string `json:"users"`
	Tokens    map[string]string `json:"tokens"`
	DialogID  string            `json:"dialogId"`
	ProjectID string            `json:"projectId"`
}

func cmdSeedDemo(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("seed demo", flag.ContinueOnError)
	ttl := fs.Duration("ttl", 24*time.Hour, "token lifetime")
	timeout := timeoutFlag(fs)
	if err := parseFlags(fs, args, out); err != nil {
		return err
	}
	if *ttl <= 0 {
		return errors.New("--ttl must be positive")
	}
	secret, err := devSecret(getenv)
	if err != nil {
		return err
	}
	db, err := startDBCommand(ctx, *timeout, getenv)
	if err != nil {
		return err
	}
	defer db.close()
	if err := seedDemo(db); err != nil {
		return err
	}
	res := demoOut{Users: map[string]string{"alice": demoAlice, "bob": demoBob}, Tokens: map[string]string{},
		DialogID: demoDialog, ProjectID: demoProject}
	for name, id := range res.Users {
		tok, err := auth.MintDevToken(secret, auth.DevClaims{Subject: id, Kind: auth.KindUser,
			Issuer: getenv("HAN_JWT_ISSUER"), Audience: getenv("HAN_JWT_AUDIENCE"), TTL: *ttl})
		if err != nil {
			return err
		}
		res.Tokens[name] = tok
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	fmt.Fprintln(out, string(b))
	return nil
}

// seedDemo migrates and writes the demo users, dialog and project, each
// step named when it fails.
func seedDemo(db *dbCommand) error {
	ctx := db.ctx
	_, err := store.Migrate(ctx, db.pool)
	if err := db.check("apply migrations", err); err != nil {
		return err
	}
	st := store.New(db.pool)
	for _, u := range []string{demoAlice, demoBob} {
		if err := db.check("create demo users", st.EnsureUser(ctx, u)); err != nil {
			return err
		}
	}
	if _, err := st.DialogForMember(ctx, demoDialog, demoAlice); errors.Is(err, store.ErrDialogNotFound) {
		_, err := st.CreateDialog(ctx, demoDialog, demoAlice, "Alice & Bob", []string{demoBob})
		if err := db.check("create demo dialog", err); err != nil {
			return err
		}
	} else if err := db.check("read demo dialog", err); err != nil {
		return err
	}
	return db.check("create demo project", st.CreateProject(ctx, demoProject, "Demo project", []store.ProjectMember{
		{UserID: demoAlice, Role: store.RoleAdmin}, {UserID: demoBob, Role: store.RoleRead}}))
}

// writePrivate replaces file with data readable by its owner only (0600),
// whatever the mode of a file already there: the data is written to a new
// file beside it, made private, and renamed over it, so no reader ever sees
// a partial file or the data under the old file's mode. A file already there
// keeps its owner and group.
func writePrivate(file string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename there is nothing left to remove
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	// The file replaced keeps its owner: Redis (its own user) reads the ACL
	// file, and a render by root would leave it unreadable at the next
	// start.
	if fi, err := os.Stat(file); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			if err := tmp.Chown(int(st.Uid), int(st.Gid)); err != nil {
				tmp.Close()
				return fmt.Errorf("keep the owner of %s (run as root or as its owner): %w", file, err)
			}
		}
	}
	// On disk before the rename, and the rename itself after it: a crash
	// must leave the old file or the new one, never an empty file in its
	// place (an empty ACL file starts Redis with the default user open).
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return err
	}
	dir, err := os.Open(filepath.Dir(file))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}
