package lua

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua project/*.lua project/lib/*.lua
var files embed.FS

// includeMarker starts a script line that compose replaces with the text of
// the fragment lib/<name>.lua in the script's own folder. A fragment defines local functions that take
// their keys as arguments, so the script passes its own KEYS and stays on its
// one hash tag.
const includeMarker = "--#include "

// Script is one embedded Lua script. Run uses EVALSHA and falls back to EVAL
// on NOSCRIPT (after a restart or SCRIPT FLUSH).
type Script struct {
	Name string
	// ReadOnly is true for scripts that declare flags=no-writes: they run
	// with EVALSHA_RO and keep working when Redis is out of memory.
	ReadOnly bool
	// Source is the text sent to Redis: the script file with its fragments
	// composed in. The same files always compose to the same text, so the
	// SHA stays the same across restarts and instances.
	Source string

	s *redis.Script
}

// Run executes the script. c may be a Client, ClusterClient, Pipeline or Tx.
//
// A script that writes is sent at most once per call: go-redis would send
// a command again after a read timeout (MaxRetries, and a cluster client's
// redirect loop), and Redis, stalled a little longer than the budget, then
// runs it twice — a publish counted twice, a claim leasing twice — while
// the caller sees only the second reply. A call whose reply never came is
// the caller's to handle (rds.Unanswered). A read-only script is retried
// as go-redis does.
func (s *Script) Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	if s.ReadOnly {
		return s.s.RunRO(ctx, c, keys, args...)
	}
	p, ok := c.(Processor)
	if !ok {
		return s.s.Run(ctx, c, keys, args...)
	}
	cmd := s.EvalSha(ctx, p, keys, args...)
	if IsNoScript(cmd.Err()) {
		cmd = evalOnce(ctx, p, "eval", s.Source, keys, args)
	}
	return cmd
}

// IsNoScript reports whether err is Redis's NOSCRIPT reply: the script's
// SHA is not loaded (after a restart or SCRIPT FLUSH), so the EVALSHA did
// not run.
func IsNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// Processor runs (a client) or queues (a pipeline) one command.
type Processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// EvalSha runs (on a client) or queues (on a pipeline) EVALSHA of the
// script, sent at most once (see Run); it does not fall back to EVAL.
func (s *Script) EvalSha(ctx context.Context, p Processor, keys []string, args ...any) *redis.Cmd {
	return evalOnce(ctx, p, "evalsha", s.Hash(), keys, args)
}

// onceCmd is a command go-redis never sends a second time (its NoRetry;
// a pipeline holding one is not retried either).
type onceCmd struct{ *redis.Cmd }

func (onceCmd) NoRetry() bool { return true }

// Reply is the script command among a pipeline's commands (Pipelined's
// result), whether Run sent it once or go-redis's own Script did.
func Reply(c redis.Cmder) *redis.Cmd {
	switch v := c.(type) {
	case *redis.Cmd:
		return v
	case onceCmd:
		return v.Cmd
	}
	cmd := redis.NewCmd(context.Background())
	cmd.SetErr(fmt.Errorf("lua: %s is not a script command", c.Name()))
	return cmd
}

// evalOnce builds the command as go-redis's Eval and EvalSha do (the keys
// from position 3, for a cluster client's routing) and processes it once.
func evalOnce(ctx context.Context, p Processor, name, payload string, keys []string, args []any) *redis.Cmd {
	argv := make([]any, 3, 3+len(keys)+len(args))
	argv[0], argv[1], argv[2] = name, payload, len(keys)
	for _, k := range keys {
		argv = append(argv, k)
	}
	if len(args) == 1 {
		// go-redis spreads a lone slice argument.
		switch a := args[0].(type) {
		case []string:
			for _, v := range a {
				argv = append(argv, v)
			}
			args = nil
		case []any:
			args = a
		case nil:
			args = nil
		}
	}
	argv = append(argv, args...)
	return SendOnce(ctx, func() *redis.Cmd {
		cmd := redis.NewCmd(ctx, argv...)
		if len(keys) > 0 {
			cmd.SetFirstKeyPos(3)
		}
		_ = p.Process(ctx, onceCmd{cmd})
		return cmd
	})
}

// SendOnce runs send — which processes one command go-redis does not
// retry — and runs it again, after a short wait, while it failed before
// any byte of it could be written: no connection could be dialled (a
// master that just died, the cluster client's slot map not yet reloaded)
// or none was free in time. Those failures go-redis would have retried;
// a command that may have been written is never sent again. On a
// pipeline send only queues, and nothing is retried.
func SendOnce[C redis.Cmder](ctx context.Context, send func() C) C {
	wait := 8 * time.Millisecond
	for attempt := 0; ; attempt++ {
		cmd := send()
		if attempt == 2 || !NotSent(cmd.Err()) {
			return cmd
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return cmd
		case <-t.C:
		}
		wait *= 4
	}
}

// NotSent reports whether err proves its command never left the client:
// a failed dial or no pooled connection free in time.
func NotSent(err error) bool {
	if err == nil {
		return false
	}
	var op *net.OpError
	return (errors.As(err, &op) && op.Op == "dial") || errors.Is(err, redis.ErrPoolTimeout)
}

// Load loads the script into c's script cache (SCRIPT LOAD).
func (s *Script) Load(ctx context.Context, c redis.Scripter) error {
	return s.s.Load(ctx, c).Err()
}

// Hash is the script's SHA1.
func (s *Script) Hash() string { return s.s.Hash() }

var registry = map[string]*Script{}

func mustLoad(name string) *Script {
	src, err := compose(files, name)
	if err != nil {
		panic("lua: " + err.Error())
	}
	first, _, _ := strings.Cut(src, "\n")
	if !strings.HasPrefix(first, "#!lua") {
		panic("lua: script " + name + " must start with a #!lua shebang")
	}
	s := &Script{Name: name, Source: src, ReadOnly: strings.Contains(first, "no-writes"), s: redis.NewScript(src)}
	registry[name] = s
	return s
}

// compose returns the script name.lua of fsys with every include line
// replaced, in place, by its fragment from the lib/ folder next to the script
// (the project scripts' fragments are theirs alone, in project/lib/). Any other line starting with
// "--#" is refused (a mistyped include would otherwise load as a comment and
// fail only when Redis runs the script), as are a fragment included twice and
// a fragment that includes another: one level keeps the composed text easy to
// read next to its files.
func compose(fsys fs.FS, name string) (string, error) {
	b, err := fs.ReadFile(fsys, name+".lua")
	if err != nil {
		return "", fmt.Errorf("missing script %s: %w", name, err)
	}
	var out strings.Builder
	included := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		if !strings.HasPrefix(line, "--#") {
			out.WriteString(line)
			continue
		}
		frag, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), includeMarker)
		if !ok {
			return "", fmt.Errorf("script %s: unknown directive %q", name, strings.TrimSpace(line))
		}
		if included[frag] {
			return "", fmt.Errorf("script %s includes %s twice", name, frag)
		}
		included[frag] = true
		text, err := fs.ReadFile(fsys, fragmentPath(name, frag))
		if err != nil {
			return "", fmt.Errorf("script %s: missing fragment %s: %w", name, frag, err)
		}
		if !strings.HasSuffix(string(text), "\n") {
			return "", fmt.Errorf("fragment %s must end with a newline", frag)
		}
		for l := range strings.Lines(string(text)) {
			if strings.HasPrefix(l, "--#") {
				return "", fmt.Errorf("fragment %s may not hold a directive", frag)
			}
		}
		out.Write(text)
	}
	return out.String(), nil
}

// fragmentPath is lib/<frag>.lua in the folder of the script name. It is not
// cleaned, so an include naming ".." stays an invalid fs path and is refused
// instead of reaching outside lib/.
func fragmentPath(name, frag string) string {
	if dir := path.Dir(name); dir != "." {
		return dir + "/lib/" + frag + ".lua"
	}
	return "lib/" + frag + ".lua"
}

// All returns every embedded script, sorted by name.
func All() []*Script {
	out := make([]*Script, 0, len(registry))
	for _, s := range registry {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// LoadAll loads every script (warm-up at start-up; Run reloads anyway).
func LoadAll(ctx context.Context, c redis.Scripter) error {
	for _, s := range All() {
		if err := s.Load(ctx, c); err != nil {
			return fmt.Errorf("load script %s: %w", s.Name, err)
		}
	}
	return nil
}

// Coordination locks: acquire with a fencing token, extend and release only
// by the owner. They are an optimisation: PostgreSQL row leases and unique
// constraints stay the real guard.
var (
	LockAcquire = mustLoad("lock_acquire")
	LockExtend  = mustLoad("lock_extend")
	LockRelease = mustLoad("lock_release")
)
