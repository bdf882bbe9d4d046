package projectapi

import (
	"context"
	"net/http"

	"github.com/gorilla/mux"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/jsonx"
	"github.com/han-app/gateway/restapi/apierr"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
)

// bodyMode says what a route reads from the request body.
type bodyMode int

const (
	noBody       bodyMode = iota
	objectBody            // a JSON object, required
	optionalBody          // a JSON object or nothing at all; its members are ignored
)

// SmallBodyLimit caps the body of every route that reads only a few short
// members (settings, topic and subscription create and patch, trim, claim,
// receipt): their largest valid body, every character of a 1024-byte topic
// description written as a six-byte \u escape, is under 8 KiB. Only the
// routes that carry a large value, cache PUT (a value up to the 16 MiB
// quota) and publish (a payload normalized to at most 16 KiB, but sent with
// any whitespace and escapes), read up to Deps.BodyLimit. Past the limit:
// 413 payload_too_large, as for Deps.BodyLimit.
const SmallBodyLimit = 64 << 10

// fieldCodes are the codes that take precedence over invalid_json for a
// problem inside that top-level member, so a client learns which field is
// wrong.
type fieldCodes map[string]*apierr.Error

// spec is what every route checks before its own work: the caller's role,
// the resource named in the path, the body.
type spec struct {
	need string // the role the caller needs on the project
	// item is the path variable naming one resource of the project ("":
	// none); an id that is no UUID names nothing: notFound.
	item     string
	notFound *apierr.Error
	body     bodyMode
	fields   fieldCodes
	// write passes the eviction-policy gate after the input is valid and
	// before the domain call.
	write bool
	// largeBody reads a body up to Deps.BodyLimit instead of
	// SmallBodyLimit.
	largeBody bool
}

// wholeProject is the spec of a route on the project itself (no resource
// in the path).
var wholeProject = spec{}

// with completes a spec for a caller with role need and the body it reads;
// a route for any role above read writes, so it passes the eviction-policy
// gate.
func (sp spec) with(need string, body bodyMode, fields fieldCodes) spec {
	sp.need, sp.body, sp.fields, sp.write = need, body, fields, need != store.RoleRead
	return sp
}

// large lets the route read a body up to Deps.BodyLimit.
func (sp spec) large() spec {
	sp.largeBody = true
	return sp
}

// route is one project route: spec, then parse turns the request into In
// (nil: In's zero value), then do calls the domain and says the answer.
type route[In any] struct {
	spec
	parse func(c *call) (In, error)
	do    func(a *API, ctx context.Context, c *call, in In) (reply, error)
}

// call is one authorised request: the project, the id of the resource in
// the path and the body's top-level members.
type call struct {
	access
	r    *http.Request
	id   string
	body map[string]json.RawMessage
	host Host
}

// limit reads ?limit= (absent: def; given once, as digits, 1..max; else
// invalid_limit).
func (c *call) limit(def, max int) (int, error) { return c.host.ParseLimit(c.r, def, max) }

// cursor reads ?cursor= ("" when absent). Given more than once (even with
// the same value) it is invalid_cursor: a client that appends the next
// cursor to the previous page's URL must learn of it, not get that page
// again.
func (c *call) cursor() (string, error) {
	vs := c.r.URL.Query()["cursor"]
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
		return vs[0], nil
	}
	return "", project.ErrInvalidCursor
}

// reply is a route's success: status and body (nil: none), or a writer of
// its own that streams it.
type reply struct {
	status  int
	body    any
	noStore bool
	stream  func(w http.ResponseWriter)
}

// serve runs a route's phases in the order every project route keeps:
// access (role, then path id), body, parse, gate, domain call, answer. The
// first failure is returned for fail to answer.
func serve[In any](a *API, rt route[In]) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		c, err := a.begin(w, r, rt.spec)
		if err != nil {
			return err
		}
		var in In
		if rt.parse != nil {
			if in, err = rt.parse(c); err != nil {
				return err
			}
		}
		ctx := r.Context()
		if rt.write {
			if err := a.gate.CheckWrite(ctx); err != nil {
				return err
			}
		}
		out, err := rt.do(a, ctx, c, in)
		if err != nil {
			return err
		}
		a.answer(w, out)
		return nil
	}
}

// begin checks the caller's access, reads the path's resource id and the
// body as the spec says.
func (a *API) begin(w http.ResponseWriter, r *http.Request, sp spec) (*call, error) {
	acc, err := a.access(r, sp.need)
	if err != nil {
		return nil, err
	}
	c := &call{access: acc, r: r, host: a.d.Host}
	if sp.item != "" {
		var ok bool
		if c.id, ok = ids.Canonical(mux.Vars(r)[sp.item]); !ok {
			return nil, sp.notFound
		}
	}
	if sp.body == noBody {
		return c, nil
	}
	b, err := a.readBody(w, r, sp.largeBody)
	if err != nil {
		return nil, err
	}
	if sp.body == optionalBody && len(b) == 0 {
		return c, nil
	}
	c.body, err = members(b, sp.fields)
	return c, err
}

func (a *API) answer(w http.ResponseWriter, out reply) {
	if out.noStore {
		w.Header().Set("Cache-Control", "no-store")
	}
	switch {
	case out.stream != nil:
		out.stream(w)
	case out.body == nil:
		w.WriteHeader(out.status)
	default:
		a.d.Host.WriteJSON(w, out.status, out.body)
	}
}

// readBody reads a JSON body under the route's body limit (enforced while
// reading: SmallBodyLimit, or Deps.BodyLimit for a large body); a
// Content-Type other than application/json is refused.
func (a *API) readBody(w http.ResponseWriter, r *http.Request, large bool) ([]byte, error) {
	if !jsonx.MediaTypeOK(r.Header.Get("Content-Type")) {
		return nil, apierr.UnsupportedMediaType
	}
	limit := min(a.d.BodyLimit, SmallBodyLimit)
	if large {
		limit = a.d.BodyLimit
	}
	return a.d.Host.ReadBody(w, r, limit)
}

// pageDTO is one page of a listing.
type pageDTO[T any] struct {
	Items      []T     `json:"items"`
	NextCursor *string `json:"nextCursor"`
}

// newPage converts a page of domain values; next "" is the last page.
func newPage[S, T any](src []S, next string, conv func(S) T) pageDTO[T] {
	p := pageDTO[T]{Items: make([]T, 0, len(src))}
	for _, s := range src {
		p.Items = append(p.Items, conv(s))
	}
	if next != "" {
		p.NextCursor = &next
	}
	return p
}
