package wsschema

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// serverFrames and clientFrames name, per direction, each frame type and
// its schema file.
var (
	serverFrames = []string{"hello", "subscribed", "event", "resync", "error", "pong", "refreshed"}
	clientFrames = []string{"subscribe", "unsubscribe", "typing", "ping", "refresh"}
)

// ErrUnknownType reports a frame whose type has no schema in its direction.
var ErrUnknownType = errors.New("wsschema: unknown frame type")

// Validator holds the compiled schema of every frame type.
type Validator struct {
	server map[string]*jsonschema.Schema
	client map[string]*jsonschema.Schema
}

// Load compiles the schemas in dir (docs/schemas/ws: one <type>.json per
// frame type, common.json for shared definitions).
func Load(dir string) (*Validator, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("schema dir: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	v := &Validator{server: map[string]*jsonschema.Schema{}, client: map[string]*jsonschema.Schema{}}
	for _, set := range []struct {
		names []string
		into  map[string]*jsonschema.Schema
	}{{serverFrames, v.server}, {clientFrames, v.client}} {
		for _, name := range set.names {
			s, err := c.Compile(filepath.Join(abs, name+".json"))
			if err != nil {
				return nil, fmt.Errorf("compile %s: %w", name, err)
			}
			set.into[name] = s
		}
	}
	return v, nil
}

// Server checks a frame the gateway sent.
func (v *Validator) Server(frame []byte) error { return check(v.server, frame) }

// Client checks a frame a client sends.
func (v *Validator) Client(frame []byte) error { return check(v.client, frame) }

func check(schemas map[string]*jsonschema.Schema, b []byte) error {
	frame := b
	if len(frame) > 300 {
		frame = append(frame[:300:300], "…"...)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("frame %s: not JSON: %w", frame, err)
	}
	obj, ok := inst.(map[string]any)
	if !ok {
		return fmt.Errorf("frame %s: not an object", frame)
	}
	typ, _ := obj["type"].(string)
	s := schemas[typ]
	if s == nil {
		return fmt.Errorf("frame %s: %w %q", frame, ErrUnknownType, typ)
	}
	if err := s.Validate(inst); err != nil {
		return fmt.Errorf("frame %s: %w", frame, err)
	}
	return nil
}
