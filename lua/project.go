package lua

// Project Redis API: the cache (docs/project-redis-api.md). Every script touches
// only the keys of one project, which share the hash tag
// {<env>:<project_id>}.
var (
	ProjectCachePut    = mustLoad("project_cache_put")
	ProjectCacheDelete = mustLoad("project_cache_delete")
	ProjectCachePrune  = mustLoad("project_cache_prune")
	ProjectCacheState  = mustLoad("project_cache_state")
	ProjectMetaSync    = mustLoad("project_meta_sync")
)
