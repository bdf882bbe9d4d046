package pubsub

import (
	"strings"
	"testing"

	"github.com/han-app/gateway/store/rds"
)

// The relay's probe after a refused row goes to the row's hash slot (on a
// Redis Cluster, the master that refused the row), under the service's
// channel prefix, whatever the row's channel looks like: the service's
// channels (no hash tag), a tagged name, and names whose text Redis hashes
// cannot be quoted as a tag.
func TestRelayProbeLivesOnTheRowsSlot(t *testing.T) {
	for _, ch := range []string{
		DialogChannel("0190a8e2-6f7c-7b1e-9c3a-2d4e5f607182"), UserChannel("u-1"), CanaryChannel("inst-a"),
		"han:rt:user:{abc}:x", "x{y}z{w}", "a{b", "a{}b", "a}b", "{}", "}{", "{", "}", "", "elsewhere:x",
	} {
		p := probeChannel(ch)
		if !strings.HasPrefix(p, relayProbePrefix) {
			t.Errorf("probe of %q is %q: not under %s", ch, p, relayProbePrefix)
		}
		if rds.Slot(p) != rds.Slot(ch) {
			t.Errorf("probe of %q is %q, in slot %d, not the row's %d", ch, p, rds.Slot(p), rds.Slot(ch))
		}
	}
}
