package restapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/restapi"
)

// U+0000 cannot be stored in a PostgreSQL text column, nor "\u0000" in a
// jsonb one. Every request field that lands in such a column refuses it
// with the field's own 400 code, on every retry, and nothing is written.
// The columns fed from requests (store/migrations): messages.body and
// client_message_id, dialogs.title, attachments.filename and content_type,
// inbox_receipts.id and kind. Project names come only from hanctl, project
// settings are numbers and booleans, idempotency records and every other
// text column hold server-made values.
func TestNULRefusedInStoredText(t *testing.T) {
	h := newHarness(t)
	alice, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	svc := mint(t, ids.New(), auth.KindService)
	msgs := "/v1/dialogs/" + d.ID + "/messages"
	attach := func(filename, contentType string) string {
		return fmt.Sprintf(`{"dialogId":%q,"filename":"%s","contentType":"%s","sizeBytes":5}`, d.ID, filename, contentType)
	}
	inbox := func(id, kind string) string {
		return fmt.Sprintf(`{"id":"%s","kind":"%s","dialogId":%q,"data":{}}`, id, kind, d.ID)
	}
	for _, c := range []struct {
		column, tok, path, body, code string
	}{
		{"messages.body", aTok, msgs, `{"body":"a\u0000b"}`, "invalid_body"},
		{"messages.body (only NUL)", aTok, msgs, `{"body":"\u0000"}`, "invalid_body"},
		{"messages.client_message_id", aTok, msgs, `{"body":"x","clientMessageId":"c\u0000"}`, "invalid_client_message_id"},
		{"dialogs.title", aTok, "/v1/dialogs", `{"memberIds":["` + bob + `"],"title":"t\u0000"}`, "invalid_title"},
		{"attachments.filename", aTok, "/v1/attachments", attach(`a\u0000.txt`, "text/plain"), "invalid_filename"},
		{"attachments.content_type", aTok, "/v1/attachments", attach("a.txt", `text/plain\u0000`), "invalid_content_type"},
		{"inbox_receipts.id", svc, "/v1/internal/inbox", inbox(`i\u0000`, "k"), "invalid_id"},
		{"inbox_receipts.kind", svc, "/v1/internal/inbox", inbox("i-1", `k\u0000`), "invalid_kind"},
	} {
		t.Run(c.column, func(t *testing.T) {
			for try := 0; try < 2; try++ { // the same answer on a retry
				code, b, _ := h.doH(c.tok, "POST", c.path, c.body, idemKey())
				wantError(t, code, b, 400, c.code)
			}
		})
	}
	var n int
	if err := h.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM messages WHERE dialog_id=$1)
		+ (SELECT count(*) FROM attachments WHERE dialog_id=$1) + (SELECT count(*) FROM inbox_receipts WHERE dialog_id=$1)
		+ (SELECT count(*) FROM dialogs WHERE created_by=$2) - 1`, d.ID, alice).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused requests wrote %d rows (%v)", n, err)
	}

	// Inbox data is not stored in a text or jsonb column: it travels in the
	// outbox event (bytea), and "\u0000" in it reaches clients unchanged.
	code, b := h.do(svc, "POST", "/v1/internal/inbox", fmt.Sprintf(`{"id":"nul-data","kind":"k","dialogId":%q,"data":{"x":"a\u0000b"}}`, d.ID))
	if code != 201 {
		t.Fatalf("inbox data with U+0000: %d %s", code, b)
	}
	var payload string
	if err := h.pool.QueryRow(context.Background(), "SELECT convert_from(payload, 'UTF8') FROM outbox WHERE entity_id='nul-data'").Scan(&payload); err != nil ||
		!strings.Contains(payload, `"data":{"x":"a\u0000b"}`) {
		t.Fatalf("outbox event %s (%v)", payload, err)
	}
}

// The last resort: if PostgreSQL itself refuses a value text or jsonb
// cannot hold (SQLSTATE 22021, 22P05), the answer is 400 invalid_json, not
// 500 internal. The errors come from the real server.
func TestPGUnstorableTextIs400(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	_, textErr := h.pool.Exec(ctx, "SELECT $1::text", "a\x00b")
	_, jsonbErr := h.pool.Exec(ctx, "SELECT $1::text::jsonb", `{"k":"\u0000"}`)
	for sqlstate, err := range map[string]error{"22021": textErr, "22P05": jsonbErr} {
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != sqlstate {
			t.Fatalf("want SQLSTATE %s from PostgreSQL, got %v", sqlstate, err)
		}
		w := httptest.NewRecorder()
		restapi.Fail(h.api, w, httptest.NewRequest("POST", "/v1/dialogs", nil), fmt.Errorf("insert: %w", err))
		wantError(t, w.Code, w.Body.Bytes(), 400, "invalid_json")
	}
}

// Strings stored only in Redis keep U+0000 byte for byte: cache values of
// both types and topic payloads.
func TestNULKeptInRedisValues(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	for _, c := range []struct{ key, typ, value string }{
		{"nul-string", "string", `a\u0000b`},
		{"nul-json", "json", `{\"k\":\"a\\u0000b\"}`},
	} {
		code, b := h.put(p.write, p, fmt.Sprintf(`{"key":%q,"type":%q,"value":"%s"}`, c.key, c.typ, c.value))
		if code != 201 {
			t.Fatalf("PUT %s: %d %s", c.key, code, b)
		}
	}
	got := map[string]string{}
	for _, page := range h.listAll(p.read, p, "") {
		for _, it := range page {
			got[it.Key] = it.Value
		}
	}
	if got["nul-string"] != "a\x00b" || got["nul-json"] != `{"k":"a\u0000b"}` {
		t.Fatalf("cache values: %q", got)
	}

	top := h.qTopic(p, "nul")
	code, b := h.qPublishRaw(p, top.ID, "p", "e", `{"k":"a\u0000b"}`)
	if code != 201 || !strings.Contains(string(b), `"payload":{"k":"a\u0000b"}`) {
		t.Fatalf("publish: %d %s", code, b)
	}
	first := decode[msgResp](t, b)
	if first.Payload["k"] != "a\x00b" {
		t.Fatalf("payload: %q", first.Payload)
	}
	code, b = h.qPublishRaw(p, top.ID, "p", "e", `{"k":"a\u0000b"}`)
	if code != 200 || decode[msgResp](t, b).ID != first.ID {
		t.Fatalf("replay: %d %s", code, b)
	}
	code, b = h.do(p.read, "GET", p.path("/topics/"+top.ID+"/messages"), "")
	if code != 200 || !strings.Contains(string(b), `"payload":{"k":"a\u0000b"}`) {
		t.Fatalf("listing: %d %s", code, b)
	}
}
