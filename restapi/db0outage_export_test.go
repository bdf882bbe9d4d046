package restapi

// DB0OutageRoutes lists the routes declared with answersDB0Outage, by
// "METHOD /template", each with whether its rate-limit decision waits for
// the idempotency reserve.
func DB0OutageRoutes(s *Server) map[string]bool {
	out := make(map[string]bool, len(s.db0Routes))
	for label, rt := range s.db0Routes {
		out[label] = rt.withReserve
	}
	return out
}
