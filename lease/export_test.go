package lease

// WaitAsync waits for the fetches and refunds in flight. Only for tests
// that drive the Store from one goroutine on a fake clock, so that no
// fetch starts while it waits.
func (s *Store) WaitAsync() { s.inflight.Wait() }
