package settings

import (
	"bytes"
	"context"
	"log/slog"

	"github.com/segmentio/encoding/json"
)

// tunable is one runtime setting the service reads: what its value must be
// to be used.
type tunable struct {
	want string // the value it takes, for the log
	ok   func(json.RawMessage) bool
}

// knownTunables are the tunables the service reads, by name
// (docs/runtime-settings.md, "Tunables the service reads"); other names
// are kept in the snapshot and ignored.
var knownTunables = map[string]tunable{
	// legacystub.TunableVerdictAfterPolls; the stub also bounds it by its
	// configured number of polls.
	"legacy_stub.verdict_after_polls": {want: "an integer >= 1", ok: func(v json.RawMessage) bool {
		var n int
		return json.Unmarshal(v, &n) == nil && n >= 1
	}},
}

// isNull reports a JSON null, which reads as no value.
func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

// servedTunables is the tunables of version as they are served, given the
// ones in force (prev): a JSON null is absent (its default applies), and a
// known tunable whose value cannot be used keeps the value in force, or is
// absent when none is, with a warning that names it (not its value). The
// version applies all the same: one bad tunable neither holds back the
// policy changes that come with and after it nor, on an instance starting
// now, takes the policy overrides out of force.
func (p *Provider) servedTunables(ctx context.Context, version int64, raw, prev map[string]json.RawMessage) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(raw))
	for name, v := range raw {
		if isNull(v) {
			continue
		}
		if t, known := knownTunables[name]; known && !t.ok(v) {
			last, kept := prev[name]
			if kept {
				out[name] = last
			}
			p.logger.LogAttrs(ctx, slog.LevelWarn, "settings: tunable value unusable; the value in force stays (the default when there is none)",
				slog.String("name", name), slog.String("want", t.want), slog.Bool("kept", kept), slog.Int64("version", version))
			continue
		}
		out[name] = v
	}
	return out
}
