package restapi_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/ratelimit"
)

// startStalledSend opens a connection to h, sends the headers of a message
// send into dialog with Expect: 100-continue, waits for the 100 Continue
// (the handler has begun to read the body: every middleware ran) and sends
// part of the body; then the client stalls. The connection is closed when
// the test ends.
func startStalledSend(t *testing.T, h *harness, tok, dialog string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	body := `{"body":"stalled send"}`
	fmt.Fprintf(conn, "POST /v1/dialogs/%s/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n",
		dialog, tok, idemKey()["Idempotency-Key"], len(body))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusContinue {
		t.Fatalf("stalled send: got %d before its body, want 100 Continue", resp.StatusCode)
	}
	if _, err := conn.Write([]byte(body[:5])); err != nil {
		t.Fatal(err)
	}
}

// Outsiders cannot use up a dialog's send limit by stalling their bodies.
// A send by someone who is no member of the dialog gives its dialog
// admission back when it is refused; a client that keeps its request body
// coming slowly delays that refusal by up to the body deadline, longer
// than a window. The dialog's limit is therefore decided only once the
// body is in, on a Redis Cluster (one script call per family) as on a
// single Redis (where the decision rides with the idempotency reserve):
// stalled sends hold none of it, and the members still send.
func TestStalledOutsiderSendsHoldNoDialogLimit(t *testing.T) {
	base := newHarness(t)
	const label = "POST /v1/dialogs/{id}/messages"
	w := 61_033 * time.Millisecond
	modes := []struct {
		name string
		mode ratelimit.Mode
	}{{"single", ratelimit.ModeAuto}, {"per-family", ratelimit.ModePerFamily}}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			l := newLimitedMode(t, base, nil, map[string]ratelimit.Policy{label: {Algorithm: ratelimit.SlidingLog, Rules: []ratelimit.Rule{
				userRule(50, w), {Family: ratelimit.FamilyIP, Limit: 1000, Window: w}, {Family: ratelimit.FamilyDialog, Limit: 3, Window: w},
			}}}, 0, m.mode)
			_, aTok := base.user()
			bob, _ := base.user()
			d := base.dialog(aTok, bob)
			_, oTok := base.user()
			for range 3 {
				startStalledSend(t, l.harness, oTok, d.ID)
			}
			for i := range 3 {
				code, b, _ := l.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"hi"}`, idemKey())
				if code != 201 {
					t.Fatalf("member's send %d while 3 outsider sends stall their bodies (dialog limit 3): %d %s", i, code, b)
				}
			}
		})
	}
}
