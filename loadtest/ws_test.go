package loadtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/loadtest"
	"github.com/han-app/gateway/loadtest/baseline"
)

func startBaseline(t *testing.T, cfg baseline.Config) *baseline.Server {
	t.Helper()
	s := baseline.New(cfg, nil)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func wsURL(s *baseline.Server) string { return "ws://" + s.Addr() + loadtest.RealtimePath }

func publish(t *testing.T, s *baseline.Server, dialogID string, frame []byte) {
	t.Helper()
	resp, err := http.Post(s.URL()+"/publish?channel="+loadtest.DialogChannelPrefix+dialogID, "application/json", bytes.NewReader(frame))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
}

func TestEventFrameFormat(t *testing.T) {
	frame := loadtest.AppendEvent(nil, "d-1", "e-1", 7, 1234567890123, 128)
	var ev struct {
		Type, Channel, ID, Event, EntityID, DialogID string
		Seq                                          int64
		Data                                         json.RawMessage
	}
	if err := json.Unmarshal(frame, &ev); err != nil {
		t.Fatalf("%v: %s", err, frame)
	}
	if ev.Type != "event" || ev.Channel != "dialog:d-1" || ev.ID != "e-1" || ev.DialogID != "d-1" || ev.Seq != 7 || len(ev.Data) != 128 {
		t.Fatalf("frame = %s (data %d bytes)", frame, len(ev.Data))
	}
	var f loadtest.Frame
	if err := loadtest.ParseFrame(frame, &f); err != nil || f.Seq != 7 || f.DialogID != "d-1" {
		t.Fatalf("ParseFrame = %+v, %v", f, err)
	}
	if ns, ok := loadtest.ScheduledNanos(f.Data); !ok || ns != 1234567890123 {
		t.Fatalf("scheduled = %d, %v", ns, ok)
	}
	// A chat message DTO carries the time in its body.
	body := loadtest.ChatBody(42, 64)
	if len(body) != 64 {
		t.Fatalf("body length %d", len(body))
	}
	dto, _ := json.Marshal(map[string]any{"id": "m", "seq": 1, "body": body})
	if ns, ok := loadtest.ScheduledNanos(dto); !ok || ns != 42 {
		t.Fatalf("from body = %d, %v", ns, ok)
	}
	if _, ok := loadtest.ScheduledNanos([]byte(`{"body":"hello"}`)); ok {
		t.Fatal("a foreign message has no schedule")
	}
}

// Deliveries are deduplicated per connection and dialog by seq, counted
// once however they are ordered, and events of other dialogs are not
// counted as deliveries.
func TestDeliveriesDedupeReorderAndLoss(t *testing.T) {
	s := startBaseline(t, baseline.Config{})
	reg := loadtest.NewRegistry()
	dl := loadtest.NewDeliveries(reg)
	d := loadtest.NewWSDialer(reg, nil, dl)
	defer d.Close()
	ctx := context.Background()
	c, err := d.Dial(ctx, wsURL(s), "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Instance != "baseline" || c.ConnectionID == "" {
		t.Fatalf("hello: %q %q", c.Instance, c.ConnectionID)
	}
	if _, err := c.Subscribe(ctx, "dlg"); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixNano()
	for _, seq := range []int64{3, 1, 1, 2, 3, 5} {
		publish(t, s, "dlg", loadtest.AppendEvent(nil, "dlg", "e", seq, now, 64))
	}
	publish(t, s, "other", loadtest.AppendEvent(nil, "other", "e", 1, now, 64))
	// Events the generator did not send (presence, typing) are not deliveries.
	publish(t, s, "dlg", []byte(`{"type":"event","channel":"dialog:dlg","id":"p","event":"presence.changed","entityId":"u","dialogId":"dlg","data":{"userId":"u","online":true}}`))
	// 4 is never published but expected: one loss.
	for seq := range int64(5) {
		dl.Published("dlg", seq+1, 1)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		return reg.Counter(loadtest.MetricDeliveryReceived).Value()+reg.Counter(loadtest.MetricDeliveryDuplicates).Value() == 6 &&
			reg.Counter(loadtest.MetricWSEventsOther).Value() == 1
	}, "deliveries did not arrive")
	if dl.Drain(ctx, 50*time.Millisecond) {
		t.Fatal("Drain reported complete with a delivery missing")
	}
	dl.Finish(time.Second)
	snap := reg.Snapshot().Metrics
	for name, want := range map[string]int64{
		loadtest.MetricDeliveryReceived: 4, loadtest.MetricDeliveryDuplicates: 2, loadtest.MetricDeliveryLost: 1,
		loadtest.MetricDeliveryExpected: 5, loadtest.MetricDeliveryUnexpected: 0, loadtest.MetricWSEventsOther: 1,
	} {
		if got := snap[name].Count; got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if lat := snap[loadtest.MetricDeliveryLatency]; lat.Count != 4 || lat.Min <= 0 {
		t.Errorf("latency samples = %d (min %v), want 4 positive", lat.Count, lat.Min)
	}
	if loss := snap[loadtest.MetricDeliveryLoss]; loss.Rate != 0.2 {
		t.Errorf("delivery_loss = %v, want 0.2", loss.Rate)
	}
}

// Loss is counted per subscriber: an event whose publish the generator saw
// fail (a timeout after the server had delivered it) is not expected
// anywhere, so its deliveries must not make up for an accepted event
// another subscriber never got. They are counted in delivery_unexpected.
func TestDeliveriesOfAFailedPublishDoNotHideALoss(t *testing.T) {
	s := startBaseline(t, baseline.Config{})
	reg := loadtest.NewRegistry()
	dl := loadtest.NewDeliveries(reg)
	d := loadtest.NewWSDialer(reg, nil, dl)
	defer d.Close()
	ctx := context.Background()
	a, err := d.Dial(ctx, wsURL(s), "")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := d.Dial(ctx, wsURL(s), "")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := a.Subscribe(ctx, "dlg"); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixNano()
	// Event 1 is accepted for both subscribers, but b is not listening
	// yet: b loses it.
	publish(t, s, "dlg", loadtest.AppendEvent(nil, "dlg", "e1", 1, now, 64))
	dl.Published("dlg", 1, 2)
	testenv.Eventually(t, 5*time.Second, func() bool { return dl.Received() == 1 }, "a did not get event 1")
	if _, err := b.Subscribe(ctx, "dlg"); err != nil {
		t.Fatal(err)
	}
	// Event 2: the publisher saw an error, yet the server delivered it.
	publish(t, s, "dlg", loadtest.AppendEvent(nil, "dlg", "e2", 2, now, 64))
	dl.PublishFailed()
	// Event 3: accepted, both get it.
	publish(t, s, "dlg", loadtest.AppendEvent(nil, "dlg", "e3", 3, now, 64))
	dl.Published("dlg", 3, 2)
	testenv.Eventually(t, 5*time.Second, func() bool { return dl.Received() == 5 }, "deliveries did not arrive")
	if dl.Drain(ctx, 50*time.Millisecond) {
		t.Error("Drain reported complete although b never got event 1")
	}
	dl.Finish(time.Second)
	m := reg.Snapshot().Metrics
	for name, want := range map[string]int64{
		loadtest.MetricDeliveryExpected: 4, loadtest.MetricDeliveryReceived: 5,
		loadtest.MetricDeliveryLost: 1, loadtest.MetricDeliveryUnexpected: 2,
	} {
		if got := m[name].Count; got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
}

// The accounting ends with Finish: an event that arrives after the drain
// was counted lost, so it must not also be counted as received nor add a
// latency sample to the run's figures.
func TestDeliveryAfterTheDrainStaysLost(t *testing.T) {
	s := startBaseline(t, baseline.Config{})
	reg := loadtest.NewRegistry()
	dl := loadtest.NewDeliveries(reg)
	d := loadtest.NewWSDialer(reg, nil, dl)
	defer d.Close()
	ctx := context.Background()
	c, err := d.Dial(ctx, wsURL(s), "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Subscribe(ctx, "dlg"); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixNano()
	dl.Published("dlg", 1, 1)
	dl.Published("dlg", 2, 1)
	publish(t, s, "dlg", loadtest.AppendEvent(nil, "dlg", "e1", 1, now, 64))
	testenv.Eventually(t, 5*time.Second, func() bool { return dl.Received() == 1 }, "event 1 did not arrive")
	if dl.Drain(ctx, 10*time.Millisecond) {
		t.Fatal("Drain reported complete without event 2")
	}
	dl.Finish(time.Second)
	msgs := reg.Counter(loadtest.MetricWSMsgsReceived)
	before := msgs.Value()
	publish(t, s, "dlg", loadtest.AppendEvent(nil, "dlg", "e2", 2, now, 64))
	testenv.Eventually(t, 5*time.Second, func() bool { return msgs.Value() > before }, "event 2 did not arrive")
	m := reg.Snapshot().Metrics
	for name, want := range map[string]int64{
		loadtest.MetricDeliveryExpected: 2, loadtest.MetricDeliveryReceived: 1, loadtest.MetricDeliveryLost: 1,
		loadtest.MetricDeliveryLatency: 1,
	} {
		if got := m[name].Count; got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if got := dl.Received(); got != 1 {
		t.Errorf("Received() = %d after the drain, want 1", got)
	}
}

func TestSubscribeRefusedAndServerGone(t *testing.T) {
	s := startBaseline(t, baseline.Config{})
	reg := loadtest.NewRegistry()
	d := loadtest.NewWSDialer(reg, nil, nil)
	defer d.Close()
	ctx := context.Background()
	c, err := d.Dial(ctx, wsURL(s), "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Subscribe(ctx, strings.Repeat("x", 100))
	var ref *loadtest.ErrSubscribeRefused
	if !errors.As(err, &ref) || ref.Code != "invalid_dialog" {
		t.Fatalf("subscribe = %v, want refused with invalid_dialog", err)
	}
	if got := reg.Counter(loadtest.Tagged(loadtest.MetricErrors, "status", "-", "code", "ws:invalid_dialog")).Value(); got != 1 {
		t.Fatalf("errors{code=ws:invalid_dialog} = %d", got)
	}
	// The server going away ends the session, counted as closed.
	_ = s.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("connection still open after the server closed")
	}
	if reg.Counter(loadtest.MetricWSClosed).Value() != 1 || d.Open() != 0 {
		t.Fatalf("ws_closed = %d, open = %d", reg.Counter(loadtest.MetricWSClosed).Value(), d.Open())
	}
	if _, err := d.Dial(ctx, wsURL(s), ""); err == nil {
		t.Fatal("dial to a closed server succeeded")
	}
}

// A server that refuses after the upgrade with advice (1013 + retryMs, as
// the gateway does while DB1 is down) fails the dial, and the advice is
// readable for the reconnect backoff.
func TestDialRefusedWithAdvice(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{loadtest.Subprotocol}})
		if err != nil {
			return
		}
		_ = c.Close(websocket.StatusTryAgainLater, `{"retryMs":250}`)
	}))
	defer srv.Close()
	reg := loadtest.NewRegistry()
	d := loadtest.NewWSDialer(reg, nil, nil)
	defer d.Close()
	_, err := d.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http")+loadtest.RealtimePath, "")
	if err == nil {
		t.Fatal("dial succeeded against a refusing server")
	}
	code, retry := loadtest.CloseAdvice(err)
	if code != int(websocket.StatusTryAgainLater) || retry != 250*time.Millisecond {
		t.Fatalf("advice = %d, %v from %v", code, retry, err)
	}
	if d.Open() != 0 {
		t.Fatalf("open = %d", d.Open())
	}
	if code, retry := loadtest.CloseAdvice(errors.New("plain")); code != -1 || retry != 0 {
		t.Fatalf("no close frame: %d %v", code, retry)
	}
}

// Known is what a reconnecting client passes as sinceSeq: the seq up to
// which it saw every event of the dialog, whoever sent them, not past a gap.
func TestKnownStopsAtTheFirstGap(t *testing.T) {
	s := startBaseline(t, baseline.Config{})
	d := loadtest.NewWSDialer(loadtest.NewRegistry(), nil, nil)
	defer d.Close()
	ctx := context.Background()
	c, err := d.Dial(ctx, wsURL(s), "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Subscribe(ctx, "dlg"); err != nil {
		t.Fatal(err)
	}
	if got := c.Known("dlg"); got != 0 {
		t.Fatalf("Known before any event = %d", got)
	}
	now := time.Now().UnixNano()
	for _, seq := range []int64{2, 1, 3, 5} {
		publish(t, s, "dlg", loadtest.AppendEvent(nil, "dlg", "e", seq, now, 64))
	}
	// Not the generator's own message (no schedule stamp): still a seq seen.
	publish(t, s, "dlg", []byte(`{"type":"event","channel":"dialog:dlg","id":"x","event":"message.created","entityId":"m","dialogId":"dlg","seq":4,"data":{"body":"hi"}}`))
	testenv.Eventually(t, 5*time.Second, func() bool { return c.Known("dlg") == 5 }, "Known did not reach 5")
	if got := c.Known("other"); got != 0 {
		t.Fatalf("Known of a dialog not subscribed = %d", got)
	}
	if _, err := c.SubscribeSince(ctx, "dlg", -1); err == nil {
		t.Fatal("SubscribeSince with a negative sinceSeq was sent")
	}
}
