package settings

import (
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store"
)

// ValidateRow checks one rate_limit_policies row as a refresh does: rules
// is the text PostgreSQL returns for the column, decoded strictly, and the
// policy set is built from the built-in table with the row applied.
func ValidateRow(route, algorithm, onFailure, rules string) error {
	rows := store.SettingsRows{
		SettingsHead: store.SettingsHead{Version: 1},
		Policies:     []store.RateLimitPolicyRow{{Route: route, Algorithm: algorithm, OnFailure: onFailure, Rules: []byte(rules)}},
	}
	s, err := fromRows(rows, "")
	if err != nil {
		return err
	}
	_, err = s.PolicySet(ratelimit.DefaultPolicies())
	return err
}
