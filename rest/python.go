package rest

import "net/http"

// Placeholder handlers: the kernel work replaces this file.

func (a *api) runPython(w http.ResponseWriter, r *http.Request)   { notYet(w) }
func (a *api) resetPython(w http.ResponseWriter, r *http.Request) { notYet(w) }
