package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/legacystub"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/settings"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// opsParts are the runtime settings provider and the legacy DB2 safety
// stub of one instance (docs/runtime-settings.md, docs/legacy-stub.md).
type opsParts struct {
	settings  *settings.Provider
	stub      *legacystub.Stub // nil while HAN_LEGACY_STUB_ENABLED is off
	stubDB2   redis.UniversalClient
	recoverer *legacystub.Recoverer
}

// legacyStubConfig is the stub's configuration from the environment.
func (m *Main) legacyStubConfig() legacystub.Config {
	c := m.Config
	return legacystub.Config{PollInterval: c.LegacyStubPollInterval, MaxPolls: c.LegacyStubMaxPolls,
		RecoveryBudget: c.LegacyStubRecoveryBudget, TaskTTL: c.LegacyStubTaskTTL, RedisTimeout: c.RedisTimeout}
}

// checkLegacyStub refuses to start, before anything is opened, when the
// stub is on and its task TTL does not cover poll interval × max polls +
// recovery budget: a task that expired while a client still polls or a
// recovery still runs would lose its verdict (docs/legacy-stub.md).
func (m *Main) checkLegacyStub() error {
	if !m.Config.LegacyStubEnabled {
		return nil
	}
	_, err := m.legacyStubConfig().Validate()
	return err
}

// startSettings loads the runtime settings (built-in policies if they
// cannot be read now; the refresh loop retries) and starts refreshing.
func (m *Main) startSettings(ctx context.Context, metrics *restapi.Metrics) error {
	cfg := m.Config
	p, err := settings.New(settings.Config{Scope: cfg.Env, Secret: []byte(cfg.HMACSecret), RefreshInterval: cfg.SettingsRefreshInterval,
		RedisTimeout: cfg.RedisTimeout, Logger: m.Logger, Registerer: metrics.Registry}, store.New(m.pg), m.rt)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if err := p.Refresh(rctx); err != nil {
		m.Logger.Warn("runtime settings not loaded at start-up; built-in policies until the next refresh")
	}
	cancel()
	p.Start()
	m.ops.settings = p
	return nil
}

// startLegacyStub opens DB2 as legacy_stub and starts the recoverer, when
// the stub is on.
func (m *Main) startLegacyStub(metrics *restapi.Metrics) error {
	cfg := m.Config
	if !cfg.LegacyStubEnabled {
		return nil
	}
	db2, err := rds.NewRedis(cfg.LegacyStubURL, rds.RedisConfig{ReadTimeout: cfg.RedisTimeout, WriteTimeout: cfg.RedisTimeout,
		PoolTimeout: cfg.RedisTimeout, DialTimeout: cfg.RedisTimeout, ClientName: "han-gateway-stub:" + cfg.InstanceID})
	if err != nil {
		return fmt.Errorf("HAN_LEGACY_STUB_URL: %w", err)
	}
	m.ops.stubDB2 = db2
	stub, err := legacystub.New(m.legacyStubConfig(), legacystub.Deps{DB2: db2, Store: store.New(m.pg),
		Tunables: m.ops.settings, Logger: m.Logger, Registerer: metrics.Registry})
	if err != nil {
		return err
	}
	m.ops.stub = stub
	m.ops.recoverer = stub.NewRecoverer(m.rt, cfg.InstanceID)
	m.ops.recoverer.Start()
	m.Logger.Warn("legacy DB2 safety stub enabled (remove with hanctl redis cutover)",
		slog.Duration("task_ttl", stub.Config().TaskTTL))
	return nil
}

// closeOps stops the background loops and closes DB2; idempotent.
func (m *Main) closeOps() error {
	if m.ops.recoverer != nil {
		m.ops.recoverer.Close()
		m.ops.recoverer = nil
	}
	if m.ops.settings != nil {
		m.ops.settings.Close()
		m.ops.settings = nil
	}
	var err error
	if m.ops.stubDB2 != nil {
		if cerr := m.ops.stubDB2.Close(); cerr != nil && !errors.Is(cerr, redis.ErrClosed) {
			err = cerr
		}
		m.ops.stubDB2 = nil
	}
	m.ops.stub = nil
	return err
}
