package memstore

// LogRuns is the number of runs the sliding window log at key holds, for
// storetest.RunLogRuns; 0 for a key the store does not hold.
func (s *Store) LogRuns(key string) int {
	c, ok := s.cells.Load(key)
	if !ok {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.st.Log)
}
