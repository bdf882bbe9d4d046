package settings

import (
	"context"

	"github.com/han-app/gateway/store"
)

// head names one settings state: settings_head's version and the stamp
// PostgreSQL draws anew on every change of that row. Two states share a
// version number only when PostgreSQL has gone back in time and reused
// it; their stamps still differ.
type head struct {
	version int64
	stamp   string
}

func headOf(h store.SettingsHead) head { return head{version: h.Version, stamp: h.Stamp} }

// readHead reads the state PostgreSQL is at (one row: the cheap check every
// instance makes on each refresh tick).
func (p *Provider) readHead(ctx context.Context) (head, error) {
	h, err := p.store.SettingsHead(ctx)
	if err != nil {
		return head{}, err
	}
	return headOf(h), nil
}

// loadRows reads every settings table and the state they belong to, in
// one consistent read. h (the state read earlier) may be older: a change
// that committed meanwhile is what the rows show.
func (p *Provider) loadRows(ctx context.Context, _ head) (store.SettingsRows, head, error) {
	rows, err := p.store.LoadSettings(ctx)
	if err != nil {
		return store.SettingsRows{}, head{}, err
	}
	return rows, headOf(rows.SettingsHead), nil
}
