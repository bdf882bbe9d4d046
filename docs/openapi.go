package docs

import (
	_ "embed"
	"encoding/json"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// OpenAPIYAML is docs/openapi.yaml, the OpenAPI 3.1 description of the
// REST API.
//
//go:embed openapi.yaml
var OpenAPIYAML []byte

// OpenAPIJSON converts OpenAPIYAML to JSON (anchors and merge keys
// resolved). Every mapping key must be a string: a status code written as
// a bare number would otherwise change meaning between YAML and JSON.
func OpenAPIJSON() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(OpenAPIYAML, &doc); err != nil {
		return nil, fmt.Errorf("docs: parse openapi.yaml: %w", err)
	}
	if err := stringKeys(doc, "$"); err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

func stringKeys(v any, at string) error {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if err := stringKeys(e, at+"."+k); err != nil {
				return err
			}
		}
	case map[any]any:
		return fmt.Errorf("docs: openapi.yaml: a key under %s is not a string (quote it)", at)
	case []any:
		for i, e := range v {
			if err := stringKeys(e, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	}
	return nil
}
