package scenarios

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/han-app/gateway/loadtest"
	"github.com/han-app/gateway/loadtest/soak"
)

// Soak runs the fault soak (package soak): it starts its own local stack
// (two gateways, private Redis and PostgreSQL) and needs no -target.
type Soak struct {
	cfg     soak.Config
	seed    uint64
	workDir string
	keep    bool
}

// Describe implements Scenario.
func (s *Soak) Describe() string {
	return "fault soak on a stack it starts (2 gateways, Redis, PostgreSQL): traffic, seeded faults, invariants"
}

// Name implements loadtest.Scenario.
func (s *Soak) Name() string { return "soak" }

// Flags implements Scenario.
func (s *Soak) Flags(fs *flag.FlagSet, _ func(string) string) {
	fs.Uint64Var(&s.seed, "seed", 1, "fault schedule seed (the same seed and -duration replay the same schedule)")
	fs.StringVar(&s.cfg.BinDir, "bin-dir", "", "directory holding han-gateway (default: this executable's)")
	fs.StringVar(&s.workDir, "work-dir", "", "working directory for the stack (default: a new temporary one, removed afterwards)")
	fs.BoolVar(&s.keep, "keep", false, "keep the working directory (logs, AOF, PostgreSQL data)")
	fs.IntVar(&s.cfg.Users, "users", 12, "users, each with one WebSocket client")
	fs.IntVar(&s.cfg.Dialogs, "dialogs", 4, "dialogs (each user is a member of two)")
	fs.IntVar(&s.cfg.Senders, "senders", 4, "chat sender loops")
	fs.DurationVar(&s.cfg.SendEvery, "send-every", 400*time.Millisecond, "time between sends of one sender loop")
	fs.DurationVar(&s.cfg.PublishEvery, "publish-every", 333*time.Millisecond, "time between project-queue publishes")
	fs.DurationVar(&s.cfg.RetryFor, "retry-for", 30*time.Second, "how long a send or publish is retried with the same key")
	fs.DurationVar(&s.cfg.Recovery, "recovery-bound", 5*time.Second, "bound on each fault's recovery")
	fs.DurationVar(&s.cfg.LivenessTTL, "liveness-ttl", 2*time.Second, "HAN_INSTANCE_LIVENESS_TTL of the gateways")
}

// DeclareMetrics implements loadtest.MetricDeclarer.
func (s *Soak) DeclareMetrics(reg *loadtest.Registry) {
	reg.Counter(soak.MetricViolations)
	reg.Trend(soak.MetricRecovery)
}

// Run implements loadtest.Scenario.
func (s *Soak) Run(ctx context.Context, t *loadtest.T) error {
	if s.cfg.Users < 4 || s.cfg.Dialogs < 2 || s.cfg.Dialogs*2 > s.cfg.Users || s.cfg.Senders < 1 || s.cfg.SendEvery <= 0 || s.cfg.PublishEvery <= 0 {
		return loadtest.Usage(errors.New("soak: want -users ≥ 4, 2 ≤ -dialogs ≤ users/2, -senders ≥ 1 and positive intervals"))
	}
	if s.cfg.BinDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		s.cfg.BinDir = filepath.Dir(exe)
	}
	if _, err := os.Stat(filepath.Join(s.cfg.BinDir, "han-gateway")); err != nil {
		return fmt.Errorf("soak: no han-gateway in %s (go build -o bin/ ./cmd/...; or -bin-dir)", s.cfg.BinDir)
	}
	dir := s.workDir
	if dir == "" {
		d, err := os.MkdirTemp("", "han-soak-")
		if err != nil {
			return err
		}
		dir = d
		if !s.keep {
			defer os.RemoveAll(d)
		}
	}
	s.cfg.Dir, s.cfg.Seed, s.cfg.Duration = dir, s.seed, t.Opts.Duration
	s.cfg.Reg, s.cfg.Src, s.cfg.Logf = t.Reg, t.Src, t.Logf
	t.Info("seed", s.seed)
	t.Info("instance_liveness_ttl", s.cfg.LivenessTTL)
	t.SetPhase("soak")
	rep, err := soak.Run(ctx, s.cfg)
	if rep != nil {
		t.Info("sends", fmt.Sprintf("%d (%d confirmed with 201)", rep.Sends, rep.SendsConfirmed))
		t.Info("queue", fmt.Sprintf("%d published, %d acknowledged", rep.QueuePublished, rep.QueueAcked))
		t.Info("socket_outages", rep.Reconnects)
		t.Info("raw_duplicate_events", rep.RawDuplicates)
		t.Info("queue_lost_in_aof_window", rep.AOFWindowLosses)
		t.Info("resources", soak.ResourceTable(rep.Resources))
		t.Info("faults", soak.FaultTable(rep.Faults))
		t.Info("violations", soak.ViolationList(rep.Violations))
	}
	if err != nil {
		return err
	}
	if len(rep.Violations) > 0 {
		return fmt.Errorf("%w: %d", soak.ErrViolations, len(rep.Violations))
	}
	return nil
}
