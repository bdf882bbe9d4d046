package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
)

// The program replays missed messages sent over REST when a client
// resubscribes with sinceSeq: the very frames the send path published,
// then subscribed recovered. HAN_WS_RECOVER_MAX reaches the gateway: one
// missed message more and the client is told to reconcile instead.
func TestRecoverOverTheSocket(t *testing.T) {
	vars := baseEnv()
	vars["HAN_WS_RECOVER_MAX"] = "3"
	m := start(t, vars)
	alice, bob := ids.New(), ids.New()
	aTok, bTok := userToken(t, alice), userToken(t, bob)
	d := restDialog(t, m, aTok, bob)
	watcher := connectRT(t, m, aTok)
	watcher.subscribe(d)
	published := map[int64]string{}
	sendAndWatch := func(n int) {
		for i := 0; i < n; i++ {
			msg := restSend(t, m, aTok, d, fmt.Sprint("m", i))
			for {
				f := watcher.expect("event")
				if f.Event == "message.created" {
					if f.Seq != msg.Seq {
						t.Fatalf("live seq %d, want %d", f.Seq, msg.Seq)
					}
					published[f.Seq] = string(f.raw)
					break
				}
			}
		}
	}
	sendAndWatch(3) // 1..3, while bob is away
	bc := connectRT(t, m, bTok)
	bc.send(`{"type":"subscribe","dialogId":"` + d + `","sinceSeq":0}`)
	for want := int64(1); want <= 3; want++ {
		f := bc.next(10 * time.Second)
		for f.Type == "event" && f.Event != "message.created" {
			f = bc.next(10 * time.Second)
		}
		if f.Type != "event" || f.Seq != want || string(f.raw) != published[want] {
			t.Fatalf("replayed %s, want the published %s", f.raw, published[want])
		}
	}
	if f := bc.expect("subscribed"); f.LastSeq != 3 || f.Recovered == nil || !*f.Recovered {
		t.Fatalf("subscribed %s, want lastSeq 3 recovered", f.raw)
	}

	sendAndWatch(4) // 4..7: one more than HAN_WS_RECOVER_MAX after 3
	again := connectRT(t, m, bTok)
	again.send(`{"type":"subscribe","dialogId":"` + d + `","sinceSeq":3}`)
	if f := again.expect("resync"); string(f.raw) != `{"type":"resync","reason":"recovery_unavailable","dialogId":"`+d+`"}` {
		t.Fatalf("resync %s", f.raw)
	}
	if f := again.expect("subscribed"); f.LastSeq != 7 || f.Recovered == nil || *f.Recovered {
		t.Fatalf("subscribed %s, want lastSeq 7 not recovered", f.raw)
	}
}

// HAN_WS_RECOVER_READ_BURST and HAN_WS_RECOVER_READ_RATE reach the
// gateway: with one read, a user's second subscribe with sinceSeq that
// needs a read of its own is answered with the dialog's resync, and
// /metrics counts it in han_ws_recover_reads_refused_total.
func TestRecoverReadBudgetReachesTheGateway(t *testing.T) {
	vars := baseEnv()
	vars["HAN_WS_RECOVER_READ_BURST"], vars["HAN_WS_RECOVER_READ_RATE"] = "1", "0.001"
	m := start(t, vars)
	alice, bob := ids.New(), ids.New()
	aTok, bTok := userToken(t, alice), userToken(t, bob)
	d1, d2 := restDialog(t, m, aTok, bob), restDialog(t, m, aTok, bob)
	restSend(t, m, aTok, d1, "one")
	restSend(t, m, aTok, d2, "two")
	bc := connectRT(t, m, bTok)
	answer := func(d string) (resync string, sub rtFrame) {
		bc.send(`{"type":"subscribe","dialogId":"` + d + `","sinceSeq":0}`)
		for {
			f := bc.next(10 * time.Second)
			switch {
			case f.Type == "resync":
				resync = string(f.raw)
			case f.Type == "subscribed":
				return resync, f
			}
		}
	}
	if resync, sub := answer(d1); resync != "" || sub.Recovered == nil || !*sub.Recovered {
		t.Fatalf("the user's one read: resync %q, subscribed %s", resync, sub.raw)
	}
	if resync, sub := answer(d2); resync != `{"type":"resync","reason":"recovery_unavailable","dialogId":"`+d2+`"}` ||
		sub.Recovered == nil || *sub.Recovered {
		t.Fatalf("past the user's reads: resync %q, subscribed %s", resync, sub.raw)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, metrics := call(t, "GET", m.URL()+"/metrics", "", "")
		return strings.Contains(metrics, "\nhan_ws_recover_reads_refused_total 1\n")
	}, "han_ws_recover_reads_refused_total is not 1")
}
