package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// The request path works in every exec mode the service accepts, straight
// to PostgreSQL and, in the modes meant for it, through PgBouncer in
// transaction pooling mode: sends and reads succeed, the lock and
// statement budgets sent with BEGIN hold for the whole transaction (a held
// row lock ends the send with ErrDatabaseBusy within the budget), and no
// server connection keeps them afterwards.
func TestRequestPathInEveryExecMode(t *testing.T) {
	_, _ = openStore(t) // migrations
	b := testenv.BouncerFor(t, env)
	routes := []struct {
		name  string
		url   string
		modes []string
	}{
		{"direct", env.DirectURL, []string{"cache_statement", "cache_describe", "exec", "simple_protocol"}},
		{"pgbouncer", b.URL(env.DirectURL, ""), []string{"cache_describe", "exec", "simple_protocol"}},
	}
	for _, r := range routes {
		for _, name := range r.modes {
			t.Run(r.name+"/"+name, func(t *testing.T) {
				mode, err := store.ParseExecMode(name)
				if err != nil {
					t.Fatal(err)
				}
				requestPathWorks(t, r.url, mode)
			})
		}
	}
}

// describe_exec is refused however it is asked for: through the URL's
// default_query_exec_mode as through HAN_DB_EXEC_MODE; a mode the variable
// sets wins over the URL's.
func TestDescribeExecInTheURLIsRefused(t *testing.T) {
	ctx := context.Background()
	url := "postgres://u@127.0.0.1:1/han?default_query_exec_mode=describe_exec"
	if pool, err := store.OpenPG(ctx, url, store.PGConfig{}); err == nil {
		pool.Close()
		t.Fatal("describe_exec in DATABASE_URL was accepted")
	} else if strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("the error quotes the URL: %v", err)
	}
	pool, err := store.OpenPG(ctx, url, store.PGConfig{ExecMode: pgx.QueryExecModeExec})
	if err != nil {
		t.Fatalf("HAN_DB_EXEC_MODE=exec over the URL's describe_exec: %v", err)
	}
	defer pool.Close()
	if got := pool.Config().ConnConfig.DefaultQueryExecMode; got != pgx.QueryExecModeExec {
		t.Fatalf("mode %v, want exec", got)
	}
}

func requestPathWorks(t *testing.T, url string, mode pgx.QueryExecMode) {
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, url, store.PGConfig{MaxConns: 4, ExecMode: mode})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// The sends and reads that must succeed run with a generous budget:
	// connecting and a round trip can take longer than a short one on a
	// loaded machine, and they would fail busy, proving nothing about the
	// mode. The short budget is for the send behind a held lock, whose
	// outcome is busy however long the machine takes.
	works := store.New(pool)
	works.SetRequestTimeout(time.Minute)
	s := store.New(pool)
	s.SetRequestTimeout(300 * time.Millisecond)
	alice, bob := ids.New(), ids.New()
	for _, u := range []string{alice, bob} {
		if err := works.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	d, err := works.CreateDialog(ctx, ids.New(), alice, "modes", []string{bob})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		m, ev, created, err := works.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d.ID, SenderID: alice, Body: "hi", ClientMessageID: ids.New(),
			Event: true})
		if err != nil || !created || m.Seq != int64(i) || ev.EntityID != m.ID {
			t.Fatalf("send %d: seq %d created %v: %v", i, m.Seq, created, err)
		}
		if err := works.MarkOutboxDelivered(ctx, ev.EventID); err != nil {
			t.Fatal(err)
		}
	}
	msgs, _, err := works.ListMessages(ctx, d.ID, 1, 10)
	if err != nil || len(msgs) != 2 || msgs[0].Seq != 2 {
		t.Fatalf("history after seq 1: %d messages: %v", len(msgs), err)
	}
	if got, err := works.DialogForMember(ctx, d.ID, bob); err != nil || got.ID != d.ID {
		t.Fatalf("dialog for a member: %v", err)
	}
	if ds, _, err := works.ListDialogs(ctx, bob, "", 10); err != nil || len(ds) != 1 || ds[0].LastMessage == nil || ds[0].LastMessage.Seq != 3 {
		t.Fatalf("listing with the last message: %+v: %v", ds, err)
	}

	locker, err := pgx.Connect(ctx, env.DirectURL)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT 1 FROM dialogs WHERE id=$1 FOR UPDATE", d.ID); err != nil {
		t.Fatal(err)
	}
	// A connection used just now: the send's short budget goes to no ping.
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	// The outer deadline only keeps a broken budget from hanging the test.
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, _, _, err = s.SendMessage(wctx, store.SendMessage{ID: ids.New(), DialogID: d.ID, SenderID: alice, Body: "x"})
	if !errors.Is(err, store.ErrDatabaseBusy) || wctx.Err() != nil {
		t.Fatalf("send behind a held row lock: %v", err)
	}
	_ = tx.Rollback(ctx)
	// Every connection the pool has (and, through the bouncer, whichever
	// server connection each statement lands on) is back at the defaults.
	for i := 0; i < 4; i++ {
		for _, name := range []string{"lock_timeout", "statement_timeout"} {
			var v string
			if err := pool.QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
				t.Fatal(err)
			}
			if v != "0" {
				t.Fatalf("%s outlived the transaction: %q", name, v)
			}
		}
	}
	if _, _, _, err := works.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d.ID, SenderID: alice, Body: "after"}); err != nil {
		t.Fatalf("send once the lock is gone: %v", err)
	}
}

// HAN_DB_EXEC_MODE names one of four modes; describe_exec, whose describe
// and execute round trips may reach two server connections behind a
// pooling proxy, is refused like any unknown name.
func TestParseExecMode(t *testing.T) {
	for in, want := range map[string]pgx.QueryExecMode{
		"": 0, "cache_statement": pgx.QueryExecModeCacheStatement, "cache_describe": pgx.QueryExecModeCacheDescribe,
		"exec": pgx.QueryExecModeExec, "simple_protocol": pgx.QueryExecModeSimpleProtocol,
	} {
		if got, err := store.ParseExecMode(in); err != nil || got != want {
			t.Errorf("%q: %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"describe_exec", "EXEC", "simple"} {
		if _, err := store.ParseExecMode(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}
