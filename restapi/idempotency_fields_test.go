package restapi

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// An idempotent request's fingerprint hashes its canonical form, a second
// struct the handler fills from the validated request. A body field the
// canonical form leaves out is outside the fingerprint: a retry that
// changes only that field would be replayed instead of answered 409
// idempotency_key_reused. So each request body and its canonical form name
// the same JSON fields.
func TestFingerprintCoversEveryBodyField(t *testing.T) {
	for _, c := range []struct {
		op         string
		body, form any
	}{
		{"message send", sendMessageReq{}, canonicalSend{}},
		{"dialog create", createDialogReq{}, canonicalDialog{}},
		{"attachment init", initAttachmentReq{}, canonicalInit{}},
	} {
		if body, form := jsonFields(c.body), jsonFields(c.form); !slices.Equal(body, form) {
			t.Errorf("%s: body fields %v, fingerprinted fields %v", c.op, body, form)
		}
	}
}

// jsonFields lists the JSON names of a struct's fields, sorted.
func jsonFields(v any) []string {
	t := reflect.TypeOf(v)
	var out []string
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" {
			name = t.Field(i).Name
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}
