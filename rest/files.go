package rest

import "net/http"

// Placeholder handlers: the files work replaces this file.

func (a *api) getFile(w http.ResponseWriter, r *http.Request)    { notYet(w) }
func (a *api) putFile(w http.ResponseWriter, r *http.Request)    { notYet(w) }
func (a *api) deleteFile(w http.ResponseWriter, r *http.Request) { notYet(w) }
func (a *api) fetchFiles(w http.ResponseWriter, r *http.Request) { notYet(w) }
