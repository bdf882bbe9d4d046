package wsschema

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const dir = "../../docs/schemas/ws"

func load(t *testing.T) *Validator {
	t.Helper()
	v, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

const (
	dialog = "7b0d3c1e-8f0a-4b7e-9a55-2f6c0e4d9a11"
	user   = "1c9f6a2e-3b4d-4e5f-8a6b-7c8d9e0f1a2b"
)

func TestServerFrames(t *testing.T) {
	v := load(t)
	msg := `{"id":"` + user + `","dialogId":"` + dialog + `","seq":3,"senderId":"` + user + `","body":"hi","createdAt":1,"attachments":[]}`
	for _, tc := range []struct {
		frame string
		ok    bool
	}{
		{`{"type":"hello","connectionId":"` + user + `","instance":"gw-1","heartbeatMs":25000,"expiresAt":1764633600000,"serverTime":1764630000000}`, true},
		{`{"type":"hello","connectionId":"` + user + `","instance":"gw-1","heartbeatMs":25000,"expiresAt":1764633600000}`, false},
		{`{"type":"hello","connectionId":"` + user + `","instance":"gw-1","heartbeatMs":25000,"expiresAt":1764633600000,"serverTime":-1}`, false},
		{`{"type":"hello","connectionId":"` + user + `","instance":"gw-1","heartbeatMs":25000}`, false},
		{`{"type":"subscribed","dialogId":"` + dialog + `","lastSeq":0}`, true},
		{`{"type":"subscribed","dialogId":"` + dialog + `","lastSeq":4,"recovered":true}`, true},
		{`{"type":"subscribed","dialogId":"` + dialog + `"}`, false},
		{`{"type":"subscribed","dialogId":"` + dialog + `","lastSeq":1,"extra":1}`, false},
		{`{"type":"event","channel":"dialog:` + dialog + `","id":"` + user + `","event":"message.created","entityId":"` + user + `","dialogId":"` + dialog + `","seq":3,"data":` + msg + `}`, true},
		{`{"type":"event","channel":"dialog:` + dialog + `","id":"` + user + `","event":"message.created","entityId":"` + user + `","dialogId":"` + dialog + `","data":` + msg + `}`, false},
		{`{"type":"event","channel":"dialog:` + dialog + `","id":"` + user + `","event":"typing","entityId":"` + user + `","dialogId":"` + dialog + `","data":{"userId":"` + user + `"}}`, true},
		{`{"type":"event","channel":"dialog:` + dialog + `","id":"` + user + `","event":"presence.changed","entityId":"` + user + `","dialogId":"` + dialog + `","data":{"userId":"` + user + `","online":false,"lastSeenAt":1733450000123,"changedAt":1733450000123}}`, true},
		{`{"type":"event","channel":"dialog:` + dialog + `","id":"` + user + `","event":"presence.changed","entityId":"` + user + `","dialogId":"` + dialog + `","data":{"userId":"` + user + `","online":true,"lastSeenAt":null,"changedAt":1733450000123}}`, true},
		{`{"type":"event","channel":"dialog:` + dialog + `","id":"` + user + `","event":"presence.changed","entityId":"` + user + `","dialogId":"` + dialog + `","data":{"userId":"` + user + `","online":false,"lastSeenAt":null}}`, false},
		{`{"type":"event","channel":"user:` + user + `","id":"` + user + `","event":"inbox.something","entityId":"x","data":{"any":1}}`, true},
		{`{"type":"resync","reason":"slow_consumer"}`, true},
		{`{"type":"resync","reason":"recovery_unavailable","dialogId":"` + dialog + `"}`, true},
		{`{"type":"resync","reason":"bored"}`, false},
		{`{"type":"error","error":"dialog_not_found"}`, true},
		{`{"type":"error","error":"nope"}`, false},
		{`{"type":"error","error":"rate_limited","retryMs":1500}`, true},
		{`{"type":"error","error":"rate_limited"}`, false},
		{`{"type":"error","error":"unauthorized","retryMs":1500}`, false},
		{`{"type":"pong"}`, true},
		{`{"type":"refreshed","expiresAt":1764637200000,"serverTime":1764633540000}`, true},
		{`{"type":"refreshed","expiresAt":1764637200000}`, false},
		{`{"type":"subscribe","dialogId":"` + dialog + `"}`, false}, // a client frame
	} {
		err := v.Server([]byte(tc.frame))
		if (err == nil) != tc.ok {
			t.Errorf("%s: ok=%v, err=%v", tc.frame, tc.ok, err)
		}
	}
	if err := v.Server([]byte(`{"type":"bogus"}`)); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("unknown type: %v", err)
	}
}

func TestClientFrames(t *testing.T) {
	v := load(t)
	for _, tc := range []struct {
		frame string
		ok    bool
	}{
		{`{"type":"subscribe","dialogId":"` + dialog + `"}`, true},
		{`{"type":"subscribe","dialogId":"` + dialog + `","sinceSeq":12}`, true},
		{`{"type":"subscribe","dialogId":"` + dialog + `","sinceSeq":-1}`, false},
		{`{"type":"subscribe","dialogId":"nope"}`, false},
		{`{"type":"unsubscribe","dialogId":"` + dialog + `"}`, true},
		{`{"type":"typing","dialogId":"` + dialog + `"}`, true},
		{`{"type":"ping"}`, true},
		{`{"type":"refresh","token":"a.b.c"}`, true},
		{`{"type":"refresh"}`, false},
	} {
		err := v.Client([]byte(tc.frame))
		if (err == nil) != tc.ok {
			t.Errorf("%s: ok=%v, err=%v", tc.frame, tc.ok, err)
		}
	}
}

// The AsyncAPI document references exactly the frame schemas this package
// checks, one message per frame type.
func TestAsyncAPIReferencesEverySchema(t *testing.T) {
	b, err := os.ReadFile("../../docs/asyncapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		AsyncAPI   string `yaml:"asyncapi"`
		Components struct {
			Messages map[string]struct {
				Payload struct {
					Ref string `yaml:"$ref"`
				} `yaml:"payload"`
			} `yaml:"messages"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.AsyncAPI, "3.") {
		t.Fatalf("asyncapi version %q", doc.AsyncAPI)
	}
	var refs []string
	for name, m := range doc.Components.Messages {
		if want := "schemas/ws/" + name + ".json"; m.Payload.Ref != want {
			t.Errorf("message %s: payload %q, want %q", name, m.Payload.Ref, want)
		}
		refs = append(refs, name)
	}
	want := append(append([]string{}, serverFrames...), clientFrames...)
	sort.Strings(refs)
	sort.Strings(want)
	if strings.Join(refs, " ") != strings.Join(want, " ") {
		t.Fatalf("asyncapi messages %v, want %v", refs, want)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(files) != len(want)+1 { // + common.json
		t.Fatalf("%d schema files, want %d (one per frame type + common.json)", len(files), len(want)+1)
	}
}
