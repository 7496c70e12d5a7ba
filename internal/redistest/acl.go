package redistest

import "context"

// AddUser creates (or resets) the ACL user name on the server with password
// and every permission on every key and channel (ACL SETUSER name reset on
// >password ~* &* +@all), so that a client can authenticate as it. The
// default user stays as it was.
func (s *Server) AddUser(ctx context.Context, name, password string) error {
	_, err := s.Do(ctx, "ACL", "SETUSER", name, "reset", "on", ">"+password, "~*", "&*", "+@all")
	return err
}
