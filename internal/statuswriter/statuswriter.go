// Package statuswriter records the status code an http.Handler answers
// with, for metrics, logs and traces, without hiding the writer's other
// abilities (Flush, and the rest through http.ResponseController).
package statuswriter

import "net/http"

// Writer wraps an http.ResponseWriter and remembers the response's final
// status: the first WriteHeader code of 200 or more (1xx informational
// answers are not the response's status), or 200 once a body or a flush
// goes out first.
type Writer struct {
	http.ResponseWriter
	status int
}

// New wraps w.
func New(w http.ResponseWriter) *Writer { return &Writer{ResponseWriter: w} }

// Status returns the response's status: 0 while nothing was written,
// which a handler that wrote nothing at all answers as 200.
func (w *Writer) Status() int { return w.status }

// WriteHeader records code and passes it on.
func (w *Writer) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write passes b on; a body without a WriteHeader first is a 200.
func (w *Writer) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher for handlers that assert it (streaming).
func (w *Writer) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }
