package restapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/han-app/gateway/internal/testenv/apicheck"
)

// A create-dialog request the server accepts is valid against the request
// schema of docs/openapi.yaml, which a generated client validates with
// before sending: memberIds may hold up to 1000 entries (repeats and the
// creator included), and a title of 200 characters may come with white
// space at its ends.
func TestCreateDialogRequestSchemaAcceptsWhatTheServerAccepts(t *testing.T) {
	h := newHarness(t)
	me, aTok := h.user()
	bob, _ := h.user()
	c, err := apicheck.Load()
	if err != nil {
		t.Fatal(err)
	}
	schema := c.Doc().Paths.Find("/v1/dialogs").Post.RequestBody.Value.Content.Get("application/json").Schema.Value
	repeats := make([]string, 150)
	for i := range repeats {
		repeats[i] = bob
	}
	creatorAnd99 := []string{me}
	for range 99 {
		o, _ := h.user()
		creatorAnd99 = append(creatorAnd99, o)
	}
	for name, body := range map[string]string{
		"150 entries naming bob":              fmt.Sprintf(`{"memberIds":["%s"]}`, strings.Join(repeats, `","`)),
		"the creator beside 99 others":        fmt.Sprintf(`{"memberIds":["%s"]}`, strings.Join(creatorAnd99, `","`)),
		"title of 200 chars padded by spaces": fmt.Sprintf(`{"memberIds":[%q],"title":"  %s  "}`, bob, strings.Repeat("x", 200)),
	} {
		if code, b := h.do(aTok, "POST", "/v1/dialogs", body); code != 201 {
			t.Fatalf("%s: %d %s", name, code, b)
		}
		var v any
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatal(err)
		}
		if err := schema.VisitJSON(v); err != nil {
			t.Errorf("%s: the server answered 201 but the request schema refuses it: %.200v", name, err)
		}
	}
}
