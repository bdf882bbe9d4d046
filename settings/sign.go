package settings

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// A shared snapshot is stored as hex(HMAC-SHA256(key, name "\n" json))
// followed by its JSON, where name is its Redis key: an instance takes a
// snapshot only when the signature is the one its own key gives for that
// key name. DB1's ACL lets the gateway's own user write the snapshot keys,
// so without it anyone holding those credentials could put any settings in
// force (rules [] on every route); with it that takes HAN_HMAC_SECRET too.
// The key name in the signature keeps a genuine snapshot of one state from
// being copied under the key of another.

// signatureLen is the length of the signature before the JSON.
const signatureLen = 2 * sha256.Size

// signingKey derives the snapshot key from the deployment's secret,
// domain-separated from the secret's other uses.
func signingKey(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("han settings snapshot v1"))
	return m.Sum(nil)
}

func (p *Provider) signature(name string, body []byte) []byte {
	m := hmac.New(sha256.New, p.key)
	m.Write([]byte(name))
	m.Write([]byte{'\n'})
	m.Write(body)
	out := make([]byte, signatureLen)
	hex.Encode(out, m.Sum(nil))
	return out
}

// sealed is the stored value of snapshot JSON body under key name.
func (p *Provider) sealed(name string, body []byte) []byte {
	return append(p.signature(name, body), body...)
}

// opened is the JSON of stored value v of key name, and whether v is a
// snapshot this deployment signed (and within MaxSnapshotBytes).
func (p *Provider) opened(name string, v []byte) ([]byte, bool) {
	if len(v) < signatureLen || len(v) > MaxSnapshotBytes {
		return nil, false
	}
	body := v[signatureLen:]
	return body, hmac.Equal(v[:signatureLen], p.signature(name, body))
}
