from django.urls import path

from . import views

app_name = "demo"
urlpatterns = [
    path("", views.index, name="index"),
    path("tasks/", views.task_table, name="tasks"),
    path("start/<str:kind>/", views.start, name="start"),
    path("tasks/<str:task_id>/cancel/", views.cancel, name="cancel"),
    path("tasks/<str:task_id>/retry/", views.retry, name="retry"),
]
