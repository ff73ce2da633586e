from django.contrib import admin
from django.urls import path

from cairnq_django.observability.views import metrics

urlpatterns = [path("admin/", admin.site.urls), path("cairnq/metrics", metrics)]
