package auth

import (
	"encoding/json"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// The claims' own time decoding accepts, refuses and yields exactly what
// jwt.RegisteredClaims' does, for every form a token's exp, nbf or iat can
// take: numbers of every shape, numbers as strings, out-of-range numbers,
// other JSON types and null.
func TestClaimsTimesDecodeAsTheLibraryDoes(t *testing.T) {
	values := []string{
		`1700000000`, `1700000000.5`, `1700000000.999999999`, `1.7e9`, `1.7E+9`, `17e8`, `0`, `-0`, `-1`, `-1.5`,
		`0.0000001`, `1e300`, `-1e300`, `1e400`, `9223372036854775807`, `9223372036854775808`, `123456789012345678901234567890`,
		`"1700000000"`, `"1.5e9"`, `"abc"`, `""`, `" 1"`, `true`, `false`, `[]`, `[1]`, `{}`, `null`,
	}
	for _, name := range []string{"exp", "nbf", "iat"} {
		for _, v := range values {
			body := `{"sub":"x","` + name + `":` + v + `}`
			var mine claims
			var lib jwt.RegisteredClaims
			errMine, errLib := json.Unmarshal([]byte(body), &mine), json.Unmarshal([]byte(body), &lib)
			if (errMine == nil) != (errLib == nil) {
				t.Fatalf("%s: ours %v, the library's %v", body, errMine, errLib)
			}
			if errMine != nil {
				continue
			}
			pairs := [][2]func() (*jwt.NumericDate, error){
				{mine.GetExpirationTime, lib.GetExpirationTime},
				{mine.GetNotBefore, lib.GetNotBefore},
				{mine.GetIssuedAt, lib.GetIssuedAt},
			}
			for _, p := range pairs {
				a, _ := p[0]()
				b, _ := p[1]()
				if (a == nil) != (b == nil) || (a != nil && !a.Equal(b.Time)) {
					t.Fatalf("%s: ours %v, the library's %v", body, a, b)
				}
			}
			if mine.Subject != "x" {
				t.Fatalf("%s: sub %q", body, mine.Subject)
			}
		}
	}
}
