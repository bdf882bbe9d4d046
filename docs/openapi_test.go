package docs

import (
	"encoding/json"
	"strings"
	"testing"
)

// The served JSON is the YAML file: the same version, paths and operations,
// with the YAML anchors resolved into full copies.
func TestOpenAPIJSON(t *testing.T) {
	b, err := OpenAPIJSON()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Fatalf("openapi %q, want 3.1.x", doc.OpenAPI)
	}
	var slash map[string]any
	if err := json.Unmarshal(doc.Paths["/projects/{projectId}/redis/"]["get"], &slash); err != nil {
		t.Fatal(err)
	}
	if slash["operationId"] != "projectSnapshotSlash" || slash["responses"] == nil {
		t.Fatalf("merged operation lost its fields: %v", slash)
	}
	if strings.Contains(string(b), `"<<"`) {
		t.Fatal("a YAML merge key reached the JSON")
	}
}

func TestStringKeysOnly(t *testing.T) {
	saved := OpenAPIYAML
	t.Cleanup(func() { OpenAPIYAML = saved })
	OpenAPIYAML = []byte("paths:\n  /x:\n    get:\n      responses:\n        200: {description: ok}\n")
	if _, err := OpenAPIJSON(); err == nil || !strings.Contains(err.Error(), "$.paths./x.get.responses") {
		t.Fatalf("a bare numeric key: %v", err)
	}
}
