package restapi_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
)

type inboxResp struct {
	ID         string `json:"id"`
	Service    string `json:"service"`
	Kind       string `json:"kind"`
	DialogID   string `json:"dialogId"`
	UserID     string `json:"userId"`
	EventID    string `json:"eventId"`
	ReceivedAt int64  `json:"receivedAt"`
}

func TestInternalInbox(t *testing.T) {
	h := newIdemHarness(t, idemOpts{})
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	svc := h.serviceToken("billing")
	ctx := context.Background()

	sub := h.rt.Subscribe(ctx, "han:rt:dialog:"+d.ID, "han:rt:user:"+alice)
	defer sub.Close()
	for i := 0; i < 2; i++ {
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
	}

	inv := "inv-" + ids.New()
	body := fmt.Sprintf(`{"id":%q,"kind":"invoice.paid","dialogId":%q,"data":{"amount": 5, "currency":"EUR"}}`, inv, d.ID)
	code, b1 := h.do(svc, "POST", "/v1/internal/inbox", body)
	if code != 201 {
		t.Fatalf("inbox: %d %s", code, b1)
	}
	rc := decode[inboxResp](t, b1)
	if rc.ID != inv || rc.Service != "billing" || rc.Kind != "invoice.paid" || rc.DialogID != d.ID || !ids.Valid(rc.EventID) || rc.ReceivedAt == 0 {
		t.Fatalf("receipt: %s", b1)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	msg, err := sub.ReceiveMessage(rctx)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"type":"event","channel":"dialog:%s","id":"%s","event":"inbox.invoice.paid","entityId":"%s","dialogId":"%s","data":{"amount":5,"currency":"EUR"}}`,
		d.ID, rc.EventID, inv, d.ID)
	if msg.Payload != want {
		t.Fatalf("event frame:\n%s\nwant\n%s", msg.Payload, want)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		return h.count("SELECT count(*) FROM outbox WHERE event_id=$1 AND delivered_at IS NOT NULL", rc.EventID) == 1
	}, "the outbox row was not marked delivered")

	// A retry (whitespace aside, the same content): 200 and the same receipt,
	// no second event.
	code, b2 := h.do(svc, "POST", "/v1/internal/inbox", strings.ReplaceAll(body, ": 5", ":5"))
	if code != 200 || !bytes.Equal(b1, b2) {
		t.Fatalf("repeat: %d %s, want 200 %s", code, b2, b1)
	}
	if n := h.count("SELECT count(*) FROM inbox_receipts WHERE id=$1", inv); n != 1 {
		t.Fatalf("%d receipts", n)
	}
	if n := h.count("SELECT count(*) FROM outbox WHERE entity_id=$1", inv); n != 1 {
		t.Fatalf("%d outbox rows for one item", n)
	}
	code, b := h.do(svc, "POST", "/v1/internal/inbox", strings.ReplaceAll(body, `"amount": 5`, `"amount":6`))
	wantError(t, code, b, 409, "inbox_conflict")
	// Ids are per service.
	if code, b := h.do(h.serviceToken("shipping"), "POST", "/v1/internal/inbox", body); code != 201 {
		t.Fatalf("same id from another service: %d %s", code, b)
	}
	if msg, err = sub.ReceiveMessage(rctx); err != nil || !strings.Contains(msg.Payload, `"entityId":"`+inv+`"`) {
		t.Fatalf("the other service's event: %v %v", msg, err)
	}

	// A user target goes to the user's channel.
	code, b = h.do(svc, "POST", "/v1/internal/inbox", fmt.Sprintf(`{"id":%q,"kind":"notice","userId":%q,"data":{}}`, "n-"+ids.New(), alice))
	if code != 201 {
		t.Fatalf("user inbox: %d %s", code, b)
	}
	msg, err = sub.ReceiveMessage(rctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(msg.Payload, `{"type":"event","channel":"user:`+alice+`"`) || !strings.Contains(msg.Payload, `"event":"inbox.notice"`) {
		t.Fatalf("user event: %s", msg.Payload)
	}
}

func TestInternalInboxRefusals(t *testing.T) {
	h := newIdemHarness(t, idemOpts{})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	service := "refusals-" + ids.New()[:8]
	svc := h.serviceToken(service)
	noSvc, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: ids.New(), Kind: auth.KindService, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ok := fmt.Sprintf(`{"id":"x-1","kind":"k","dialogId":%q,"data":{}}`, d.ID)
	cases := []struct {
		name, tok, body string
		status          int
		code            string
	}{
		{"user token", aTok, ok, 403, "forbidden"},
		{"no token", "", ok, 401, "unauthorized"},
		{"service token without svc", noSvc, ok, 403, "forbidden"},
		{"missing id", svc, fmt.Sprintf(`{"kind":"k","dialogId":%q,"data":{}}`, d.ID), 400, "invalid_id"},
		{"bad id", svc, fmt.Sprintf(`{"id":"a b","kind":"k","dialogId":%q,"data":{}}`, d.ID), 400, "invalid_id"},
		{"bad kind", svc, fmt.Sprintf(`{"id":"x","kind":"Message Created","dialogId":%q,"data":{}}`, d.ID), 400, "invalid_kind"},
		{"no target", svc, `{"id":"x","kind":"k","data":{}}`, 400, "invalid_target"},
		{"two targets", svc, fmt.Sprintf(`{"id":"x","kind":"k","dialogId":%q,"userId":%q,"data":{}}`, d.ID, bob), 400, "invalid_target"},
		{"data not an object", svc, fmt.Sprintf(`{"id":"x","kind":"k","dialogId":%q,"data":[1]}`, d.ID), 400, "invalid_data"},
		{"data missing", svc, fmt.Sprintf(`{"id":"x","kind":"k","dialogId":%q}`, d.ID), 400, "invalid_data"},
		{"data too large", svc, fmt.Sprintf(`{"id":"x","kind":"k","dialogId":%q,"data":{"s":"%s"}}`, d.ID, strings.Repeat("a", 17<<10)), 400, "invalid_data"},
		{"unknown dialog", svc, fmt.Sprintf(`{"id":"x","kind":"k","dialogId":%q,"data":{}}`, ids.New()), 404, "dialog_not_found"},
		{"unknown user", svc, fmt.Sprintf(`{"id":"x","kind":"k","userId":%q,"data":{}}`, ids.New()), 404, "user_not_found"},
		{"duplicate key", svc, fmt.Sprintf(`{"id":"x","id":"y","kind":"k","dialogId":%q,"data":{}}`, d.ID), 400, "invalid_json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, b := h.do(c.tok, "POST", "/v1/internal/inbox", c.body)
			wantError(t, code, b, c.status, c.code)
		})
	}
	// A service token still cannot use the user routes.
	code, b := h.do(svc, "GET", "/v1/dialogs", "")
	wantError(t, code, b, 403, "user_session_required")
	if n := h.count("SELECT count(*) FROM inbox_receipts WHERE service=$1", service); n != 0 {
		t.Fatalf("refused requests wrote %d receipts", n)
	}
}
