package restapi

import "net/http"

// Fail renders err as the answer to r exactly as a handler's failure is
// rendered, for errors no request can provoke once validation is complete.
func Fail(s *Server, w http.ResponseWriter, r *http.Request, err error) { s.fail(w, r, err) }
