package restapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store"
)

const sendLabel = "POST /v1/dialogs/{id}/messages"

// dialogLimited is a server whose message send has a user limit of 30 and
// a dialog limit of dialogLimit per window w (no ip family: the ip key is
// shared by the package's tests).
func dialogLimited(t *testing.T, base *harness, dialogLimit int, w time.Duration) *limited {
	t.Helper()
	return newLimited(t, base, nil, map[string]ratelimit.Policy{
		sendLabel: {Algorithm: ratelimit.SlidingLog, Rules: []ratelimit.Rule{
			userRule(30, w), {Family: ratelimit.FamilyDialog, Limit: dialogLimit, Window: w}}},
	}, 0)
}

// sendTo posts body into dialog with the headers hdr.
func (h *harness) sendTo(tok, dialog, body string, hdr map[string]string) (int, []byte, http.Header) {
	h.t.Helper()
	return h.doH(tok, "POST", "/v1/dialogs/"+dialog+"/messages", body, hdr)
}

// dialogAdmissions is how many admissions the dialog's sliding log holds.
func dialogAdmissions(t *testing.T, dialog string, w time.Duration) int64 {
	t.Helper()
	ad := env.Redis.AdminClient(0)
	defer ad.Close()
	k := ratelimit.Key(ratelimit.FamilyDialog, dialog, ratelimit.RouteHash(sendLabel), ratelimit.SlidingLog, w)
	return ad.ZCard(context.Background(), k).Val()
}

// Only members spend a dialog's limit: a send refused for any reason — a
// malformed body, a missing Idempotency-Key, a key reused for another
// request, as well as a sender who is not a member — gives its dialog
// admission back, so outsiders who know a dialog's id cannot use its limit
// up with refused sends and leave its members facing 429. The refusals
// carry no dialog item in their RateLimit fields.
func TestHTTPOutsidersRefusedSendsSpendNoDialogLimit(t *testing.T) {
	base := newHarness(t)
	w := 10 * time.Second
	for _, c := range []struct {
		name, body string
		hdr        func() map[string]string
		code       int
		err        string
	}{
		{"missing key", `{"body":"x"}`, func() map[string]string { return nil }, 400, "idempotency_key_required"},
		{"invalid body", `{}`, idemKey, 400, "invalid_body"},
		{"invalid json", `{"body":`, idemKey, 400, "invalid_json"},
		{"invalid attachment", `{"body":"x","attachmentIds":["nope"]}`, idemKey, 400, "invalid_attachment"},
		{"not a member", `{"body":"x"}`, idemKey, 404, "dialog_not_found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := dialogLimited(t, base, 3, w)
			_, aTok := l.user()
			bob, _ := l.user()
			_, eTok := l.user() // the outsider
			d := l.dialog(aTok, bob)
			for i := range 4 {
				code, b, hdr := l.sendTo(eTok, d.ID, c.body, c.hdr())
				wantError(t, code, b, c.code, c.err)
				if st := hdr.Get("RateLimit"); strings.Contains(st, "dialog") || hdr.Get("RateLimit-Policy") != `"user";q=30;w=10` {
					t.Fatalf("outsider's refused send %d: RateLimit-Policy %q RateLimit %q, want the user item alone", i, hdr.Get("RateLimit-Policy"), st)
				}
			}
			if n := dialogAdmissions(t, d.ID, w); n != 0 {
				t.Fatalf("the dialog's log holds %d admissions after 4 refused outsider sends", n)
			}
			for i := range 3 {
				if code, b, hdr := l.sendTo(aTok, d.ID, `{"body":"hi"}`, idemKey()); code != 201 {
					t.Fatalf("member's send %d after the outsider's refused sends: %d %s (RateLimit %q)", i, code, b, hdr.Get("RateLimit"))
				}
			}
		})
	}
	t.Run("reused key", func(t *testing.T) {
		l := dialogLimited(t, base, 3, w)
		_, aTok := l.user()
		bob, _ := l.user()
		eve, eTok := l.user()
		_, fTok := l.user()
		d := l.dialog(aTok, bob)
		own := l.dialog(fTok, eve)
		k := idemKey()
		if code, b, _ := l.sendTo(eTok, own.ID, `{"body":"mine"}`, k); code != 201 {
			t.Fatalf("own send: %d %s", code, b)
		}
		for i := range 4 {
			code, b, hdr := l.sendTo(eTok, d.ID, `{"body":"x"}`, k)
			wantError(t, code, b, 409, "idempotency_key_reused")
			if strings.Contains(hdr.Get("RateLimit"), "dialog") {
				t.Fatalf("409 %d: RateLimit %q", i, hdr.Get("RateLimit"))
			}
		}
		for i := range 3 {
			if code, b, _ := l.sendTo(aTok, d.ID, `{"body":"hi"}`, idemKey()); code != 201 {
				t.Fatalf("member's send %d after the outsider's 409s: %d %s", i, code, b)
			}
		}
	})
}

// A refused send shows its sender nothing of the dialog: the RateLimit
// fields of an outsider's 400 into a busy dialog are those of a 400 into a
// random id, so the outsider can neither tell the dialog exists nor count
// its members' messages.
func TestHTTPOutsiderRefusedSendShowsNoDialogQuota(t *testing.T) {
	base := newHarness(t)
	l := dialogLimited(t, base, 60, 10*time.Second)
	_, aTok := l.user()
	bob, _ := l.user()
	_, eTok := l.user()
	d := l.dialog(aTok, bob)
	for i := range 5 {
		code, b, hdr := l.sendTo(aTok, d.ID, `{"body":"hi"}`, idemKey())
		if want := fmt.Sprintf(`"dialog";r=%d;`, 59-i); code != 201 || !strings.Contains(hdr.Get("RateLimit"), want) {
			t.Fatalf("member send %d: %d %s RateLimit %q, want %s (a member sees the dialog's quota)", i, code, b, hdr.Get("RateLimit"), want)
		}
	}
	_, _, real := l.sendTo(eTok, d.ID, `{"body":"x"}`, nil)
	_, _, none := l.sendTo(eTok, ids.New(), `{"body":"x"}`, nil)
	if real.Get("RateLimit-Policy") != none.Get("RateLimit-Policy") || strings.Contains(real.Get("RateLimit"), "dialog") ||
		strings.Contains(none.Get("RateLimit"), "dialog") {
		t.Fatalf("existing dialog: %q %q; unknown id: %q %q", real.Get("RateLimit-Policy"), real.Get("RateLimit"),
			none.Get("RateLimit-Policy"), none.Get("RateLimit"))
	}
}

// A dialog whose limit its members used up answers an outsider as an
// unknown id does: the answer its request gets past the limiter (400 for a
// malformed body, 404 dialog_not_found for a send), its own user limit
// charged, no dialog item. A member is answered 429 with the dialog's quota.
func TestHTTPFullDialogAnswersAnOutsiderAsAnUnknownDialog(t *testing.T) {
	base := newHarness(t)
	w := 10 * time.Second
	l := dialogLimited(t, base, 2, w)
	_, aTok := l.user()
	bob, bTok := l.user()
	_, eTok := l.user()
	d := l.dialog(aTok, bob)
	for _, tok := range []string{aTok, bTok} {
		if code, b, _ := l.sendTo(tok, d.ID, `{"body":"hi"}`, idemKey()); code != 201 {
			t.Fatalf("member send: %d %s", code, b)
		}
	}
	for i, target := range []string{d.ID, ids.New(), d.ID} {
		code, b, hdr := l.sendTo(eTok, target, `{"body":"x"}`, idemKey())
		wantError(t, code, b, 404, "dialog_not_found")
		// Each round's two requests cost the outsider's user limit two.
		if want := fmt.Sprintf(`"user";r=%d;t=10`, 29-2*i); hdr.Get("RateLimit") != want || hdr.Get("Retry-After") != "" {
			t.Fatalf("outsider send %d: RateLimit %q Retry-After %q, want %q", i, hdr.Get("RateLimit"), hdr.Get("Retry-After"), want)
		}
		code, b, hdr = l.sendTo(eTok, target, `{}`, idemKey())
		wantError(t, code, b, 400, "invalid_body")
		if strings.Contains(hdr.Get("RateLimit"), "dialog") {
			t.Fatalf("outsider's 400 %d: RateLimit %q", i, hdr.Get("RateLimit"))
		}
	}
	code, b, hdr := l.sendTo(aTok, d.ID, `{"body":"again"}`, idemKey())
	wantError(t, code, b, 429, "rate_limited")
	if !strings.Contains(hdr.Get("RateLimit"), `"dialog";r=0;`) || hdr.Get("Retry-After") == "" {
		t.Fatalf("member's 429: RateLimit %q Retry-After %q", hdr.Get("RateLimit"), hdr.Get("Retry-After"))
	}
	if n := dialogAdmissions(t, d.ID, w); n != 2 {
		t.Fatalf("the dialog's log holds %d admissions, want its members' 2", n)
	}
}

// A replay answers a send that was counted when it committed; it sends
// nothing, so it gives its dialog admission back and shows no dialog item.
// A member's retries of one send do not use up the dialog's limit.
func TestHTTPReplaysSpendNoDialogLimit(t *testing.T) {
	base := newHarness(t)
	w := 10 * time.Second
	l := dialogLimited(t, base, 2, w)
	_, aTok := l.user()
	bob, bTok := l.user()
	d := l.dialog(aTok, bob)
	k := idemKey()
	if code, b, _ := l.sendTo(aTok, d.ID, `{"body":"once"}`, k); code != 201 {
		t.Fatalf("send: %d %s", code, b)
	}
	for i := range 3 {
		code, b, hdr := l.sendTo(aTok, d.ID, `{"body":"once"}`, k)
		if code != 201 || hdr.Get("Idempotent-Replayed") != "true" || strings.Contains(hdr.Get("RateLimit"), "dialog") {
			t.Fatalf("replay %d: %d %s replayed %q RateLimit %q", i, code, b, hdr.Get("Idempotent-Replayed"), hdr.Get("RateLimit"))
		}
	}
	if code, b, hdr := l.sendTo(bTok, d.ID, `{"body":"second"}`, idemKey()); code != 201 || !strings.Contains(hdr.Get("RateLimit"), `"dialog";r=0;`) {
		t.Fatalf("second send after 3 replays: %d %s RateLimit %q", code, b, hdr.Get("RateLimit"))
	}
}

// A send that repeats an earlier clientMessageId under a new
// Idempotency-Key answers the message it repeats and writes nothing into
// the dialog: like a replay, it gives its dialog admission back.
func TestHTTPRepeatedClientMessageIDSpendsNoDialogLimit(t *testing.T) {
	base := newHarness(t)
	w := 10 * time.Second
	l := dialogLimited(t, base, 2, w)
	_, aTok := l.user()
	bob, bTok := l.user()
	d := l.dialog(aTok, bob)
	body := `{"body":"once","clientMessageId":"c-1"}`
	if code, b, _ := l.sendTo(aTok, d.ID, body, idemKey()); code != 201 {
		t.Fatalf("send: %d %s", code, b)
	}
	for i := range 3 {
		if code, b, _ := l.sendTo(aTok, d.ID, body, idemKey()); code != 200 && code != 201 {
			t.Fatalf("repeat %d: %d %s", i, code, b)
		}
	}
	if n := dialogAdmissions(t, d.ID, w); n != 1 {
		t.Fatalf("the dialog's log holds %d admissions after one message and three repeats of it, want 1", n)
	}
	if code, b, hdr := l.sendTo(bTok, d.ID, `{"body":"second"}`, idemKey()); code != 201 || !strings.Contains(hdr.Get("RateLimit"), `"dialog";r=0;`) {
		t.Fatalf("second message after three repeats: %d %s RateLimit %q", code, b, hdr.Get("RateLimit"))
	}
}

// A send whose statement reached PostgreSQL but whose answer was lost may
// have committed: it is answered 503 database_unavailable and keeps its
// dialog admission (the message may be in the dialog), unlike a refusal.
func TestHTTPSendOfUnknownOutcomeKeepsItsDialogAdmission(t *testing.T) {
	base := newHarness(t)
	p, dbURL := faultproxy.ForURL(t, env.DatabaseURL)
	pool, err := store.OpenPG(context.Background(), dbURL, store.PGConfig{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(p.Cut) // before the pool closes: links pgx gave up on
	st := store.New(pool)
	st.SetRequestTimeout(300 * time.Millisecond)
	proxied := *base
	proxied.store = st
	w := 10 * time.Second
	l := dialogLimited(t, &proxied, 5, w)
	_, aTok := l.user()
	bob, _ := l.user()
	d := base.dialog(aTok, bob)
	// The send's statement (the chunk that carries its body) reaches
	// PostgreSQL, runs and commits; its answer is lost.
	body := "lost answer " + ids.New()
	held, release := p.HoldRequest([]byte(body))
	go func() {
		<-held
		p.MuteReplies(true)
		release()
	}()
	code, b, hdr := l.sendTo(aTok, d.ID, `{"body":"`+body+`"}`, idemKey())
	p.MuteReplies(false)
	wantError(t, code, b, 503, "database_unavailable")
	if strings.Contains(hdr.Get("RateLimit"), "dialog") {
		t.Fatalf("503 of unknown outcome: RateLimit %q", hdr.Get("RateLimit"))
	}
	msgs, _, err := base.store.ListMessages(context.Background(), d.ID, 0, 10)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("%d messages (%v): the send did not commit, the test proves nothing", len(msgs), err)
	}
	if n := dialogAdmissions(t, d.ID, w); n != 1 {
		t.Fatalf("the dialog's log holds %d admissions after a send that committed unanswered, want 1", n)
	}
}
